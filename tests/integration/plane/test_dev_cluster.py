"""``./dev cluster up|down|status``: the plane as a local cluster of real nodes for people (its own
processes, mounts, cgroups, namespaces, veths, routes and rules, all gone after ``down``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from kubernetes import client, config

from tests.plane import network, node
from tests.plane.plane import KSERVE_RUNTIME, PLANES, PlaneState
from tests.plane.procs import _alive

pytestmark = pytest.mark.timeout(600)


def cluster(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.plane.cluster", "--root", str(root), *args],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[3],
                          env={**os.environ, "EDL_PLANE_IP_BASE": str(BASE)})  # clear of the test planes'


BASE = 200


def host_rules() -> str:
    """The host's nftables ruleset and iptables rules, less their counters and timestamps."""
    text = "".join(subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
                   for argv in (["nft", "list", "ruleset"], ["iptables-save"]))
    text = re.sub(r"packets \d+ bytes \d+|\[\d+:\d+\]", "", text)
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


def launch_a_job_from_here(api: client.ApiClient, exports: dict[str, str], root: Path) -> None:
    """What the README's "Try it on a local cluster" does: data on the cluster's S3, edl's RBAC and
    the S3 Secret in a namespace, then ``edl launch`` from this machine with the images from
    ``$EDL_REGISTRY``; the job runs there (its trainers in the trainer image) and succeeds."""
    import base64

    from edl.cluster import manifests
    from tests.plane.fixtures import apply

    env = {**os.environ, **exports}
    core = client.CoreV1Api(api)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml", "labels": {
        "pod-security.kubernetes.io/enforce": "restricted"}}})
    apply(api, manifests.rbac("ml"), "ml")
    core.create_namespaced_secret("ml", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "minio"}, "data": {
        k: base64.b64encode(exports[k].encode()).decode()
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}})
    edl = [sys.executable, "-m", "edl"]
    prep = subprocess.run([*edl, "data", "prepare", "digits", "--out", "s3://data/digits"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert prep.returncode == 0, prep.stderr
    reg = exports["EDL_REGISTRY"]
    summary = root / "summary.json"
    run = subprocess.run([*edl, "launch", "--job-name", "mnist", "--model-def", "edl.zoo.digits", "--data",
                          "s3://data/digits", "--epochs", "1", "--batch-size", "16", "--max-trainers", "2",
                          "--checkpoint-uri", "s3://ckpt/mnist", "--s3-secret", "minio", "--namespace", "ml",
                          "--trainer-cpu", "1", "--trainer-memory", "2Gi", "--kubeconfig", exports["KUBECONFIG"],
                          "--master-via", "pod-ip", "--image", f"{reg}/edl-runtime:0.1.0",
                          "--trainer-image", f"{reg}/edl-trainer-cpu:0.1.0", "--summary-out", str(summary)],
                         env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    s = json.loads(summary.read_text())
    assert s["status"] == "succeeded" and s["epochs_completed"] == 1


def test_cluster_up_prints_exports_runs_our_pods_and_down_leaves_no_process():
    PLANES.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="cluster-", dir=PLANES))
    rules = host_rules()
    up = cluster(root, "up", "--nodes", "3", "--cpu", "2", "--kserve")
    try:
        assert up.returncode == 0, up.stderr
        lines = dict(line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines())
        assert set(lines) == {"KUBECONFIG", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "EDL_REGISTRY"}
        api = config.new_client_from_config(config_file=lines["KUBECONFIG"])
        core = client.CoreV1Api(api)
        nodes = core.list_node().items
        assert len(nodes) == 3
        ready = {n.metadata.name: next(c for c in n.status.conditions if c.type == "Ready") for n in nodes}
        assert all(c.status == "True" for c in ready.values()), {k: (c.status, c.reason, c.message) for k, c in ready.items()}
        assert all(n.status.node_info.container_runtime_version.startswith("containerd://") for n in nodes)
        while not core.list_namespaced_service_account("default").items:  # made by a controller
            time.sleep(0.1)
        core.create_namespaced_pod("default", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hi"},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "c", "image": f"{lines['EDL_REGISTRY']}/edl-runtime:0.1.0", "args": ["--help"]}]}})
        deadline = time.monotonic() + 60
        while core.read_namespaced_pod("hi", "default").status.phase != "Succeeded":
            assert time.monotonic() < deadline, core.read_namespaced_pod("hi", "default").status
            time.sleep(0.3)
        assert core.read_namespaced_pod_log("hi", "default").startswith("usage: edl")
        # --kserve: KServe's controller runs, with edl's serving runtime installed (the KServe test serves with it).
        assert _alive(PlaneState.load(root).pids["kserve-manager"])
        runtime = client.CustomObjectsApi(api).get_cluster_custom_object(
            "serving.kserve.io", "v1alpha1", "clusterservingruntimes", KSERVE_RUNTIME)
        assert runtime["spec"]["containers"][0]["image"] == f"{lines['EDL_REGISTRY']}/edl-runtime:0.1.0"
        launch_a_job_from_here(api, lines, root)
        again = cluster(root, "up")
        assert again.returncode == 0 and "already up" in again.stderr
        assert cluster(root, "status").returncode == 0
        state = PlaneState.load(root)
        pids = [*state.pids.values(), *(p for n in state.nodes for p in n.pids.values())]
        assert pids and all(_alive(p) for p in pids)
        net = network.PlaneNet(BASE)
        assert len(net.namespaces()) == 3 and node.cgroup_dirs(state.nodes[0].cgroup_root)
    finally:
        down = cluster(root, "down")
    assert down.returncode == 0, down.stderr
    assert not [p for p in pids if _alive(p)]
    left = subprocess.run(["pgrep", "-f", str(root)], capture_output=True, text=True).stdout.split()
    assert [p for p in left if int(p) != os.getpid()] == []
    # Nothing of it stays: no mount, cgroup, namespace, veth, route or rule.
    assert node.mounts_under(root) == []
    assert [d for n in state.nodes for d in node.cgroup_dirs(n.cgroup_root)] == []
    assert net.namespaces() == [] and net.links() == [] and net.routes() == []
    assert host_rules() == rules  # kube-proxy's and the CNI's rules lived in the nodes' namespaces
