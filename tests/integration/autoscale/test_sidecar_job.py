"""The autoscale sidecar as the launcher runs it (``edl.autoscale.run``, a thread) next to a real job,
its Kubernetes view from the test plane.

The job is a real ``edl train`` (master, Paddle trainers on this machine); the sidecar uses a client
with the ``edl-launcher`` ServiceAccount's token (its RBAC enforced by the real apiserver), watches the
plane's nodes and pods, publishes its Lease, runs the policy and sets the master's desired count, which
the local launcher follows.
"""

from __future__ import annotations

import json
import logging
import re
import time

import pytest

from kubernetes import client

from edl.api.cluster import MasterEndpoint, Resources
from edl.autoscale.run import start_sidecar
from edl.autoscale.sidecar import SidecarConfig
from edl.cluster import manifests
from edl.cluster.demand_lease import REASON_ANNOTATION, demand_from_lease
from edl.cluster.kube_api import KubeApi
from edl.masterlink import FollowedMaster
from tests.waits import wait_for
from tests.conftest import run_edl
from tests.integration.cluster.test_kube_adapter import sa_token, token_client

pytestmark = pytest.mark.timeout(240)


def node_cpu(kube: client.ApiClient) -> float:
    """The CPU each of the plane's nodes gives pods (2)."""
    from kubernetes.utils.quantity import parse_quantity

    return float(min(parse_quantity(n.status.allocatable["cpu"]) for n in client.CoreV1Api(kube).list_node().items))


def start(job, api: client.ApiClient, namespace: str, trainer_cpu: float, period: float = 0.5):
    """The sidecar as ``edl launch`` starts it, for the local ``job``: 1..3 trainers of ``trainer_cpu``."""
    info = job.info()
    endpoint = MasterEndpoint(info["address"], info["token"], adopted=False)
    cfg = SidecarConfig(f"{namespace}/{job.name}", Resources(trainer_cpu, 1), 1, 3, period, 0.1)
    return start_sidecar(KubeApi(api, namespace, give_up_s=1.0), job.name, cfg, FollowedMaster(lambda: endpoint),
                         "edl", None)


def job_args(digits, tmp_path):
    return ["--model-def", "edl.zoo.digits", "--data", str(digits), "--epochs", "400", "--batch-size", "16",
            "--min-trainers", "1", "--max-trainers", "3", "--trainers", "1",
            "--checkpoint-uri", str(tmp_path / "ckpt"), "--checkpoint-interval", "5"]


def test_sidecar_grows_into_idle_capacity_and_hands_it_back(digits, tmp_path, job_runner, plane, kube, namespace,
                                                             caplog):
    caplog.set_level(logging.INFO, logger="edl.sidecar")
    api = token_client(plane, sa_token(kube, namespace, manifests.LAUNCHER_SA))
    job = job_runner("sc", job_args(digits, tmp_path)).start()
    job.wait_for(lambda s: s["world_size"] == 1, what="one trainer training")
    cores = node_cpu(kube)
    trainer_cpu, web_cpu = cores / 2, cores * 3 / 4
    sidecar = start(job, api, namespace, trainer_cpu)
    try:
        # Two idle nodes, half a node per trainer: the job grows to its max of 3.
        job.wait_for(lambda s: s["desired_trainers"] == 3 and s["world_size"] == 3, timeout=120,
                     what="growth to 3 trainers")
        leases = {ls.metadata.name: ls for ls in client.CoordinationV1Api(kube).list_namespaced_lease(namespace).items}
        # The job's demand, and the namespace's autoscaler Lease, held by its only sidecar (which decides).
        assert sorted(leases) == ["edl-autoscaler", "edl-sc-demand"]
        assert leases["edl-autoscaler"].spec.holder_identity
        raw = kube.sanitize_for_serialization(leases["edl-sc-demand"])
        d = demand_from_lease(raw, time.time())
        assert (d.name, d.min, d.max, d.trainer.cpu) == (f"{namespace}/sc", 1, 3, trainer_cpu)
        # Why it is at 3, on the Lease and in the status; `edl status` prints it under its table.
        assert json.loads(raw["metadata"]["annotations"][REASON_ANNOTATION])["cause"] in ("growing", "at_max")
        job.wait_for(lambda s: (s["reason"] or {}).get("cause") == "at_max", timeout=10, what="the reason at max")
        shown = run_edl("status", "sc", env={"EDL_HOME": str(job.home)})
        assert shown.returncode == 0 and shown.stdout.splitlines()[-1] == "reason: at its maximum of 3 trainers", shown
        # A higher-priority service takes three quarters of each node: the job shrinks within a period.
        core = client.CoreV1Api(kube)
        for i in range(2):
            core.create_namespaced_pod(namespace, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"web-{i}"},
                "spec": {"priorityClassName": "edl-high", "terminationGracePeriodSeconds": 1,
                         "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                         "containers": [{"name": "web", "image": plane.image("runtime"), "command": ["sleep", "600"],
                                         "securityContext": {"allowPrivilegeEscalation": False, "runAsUser": 10001,
                                                             "capabilities": {"drop": ["ALL"]}},
                                         "resources": {"requests": {"cpu": f"{web_cpu:g}", "memory": "64Mi"}}}]}})
        t0 = time.monotonic()
        job.wait_for(lambda s: s["desired_trainers"] == 1, timeout=30, what="hand-back to 1 trainer")
        assert time.monotonic() - t0 < 10  # one 0.5 s period plus scheduling and the watch, with margin
        job.wait_for(lambda s: s["world_size"] == 1, timeout=60, what="the drain to finish")
        # Handed back to the service, which the reason names. Once shrunk, the nodes have no room even for the
        # job's minimum as the cluster shows it (this job's trainers run beside the plane, not in its pods):
        # it waits for room, naming the same pods.
        said = job.wait_for(lambda s: (s["reason"] or {}).get("cause") == "waiting", timeout=10, what="waiting")
        assert all(f"web-{i} (1 pod, {web_cpu:g} CPU)" in said["reason"]["text"] for i in range(2))
        def lease_reason() -> str:
            raw = kube.sanitize_for_serialization(
                client.CoordinationV1Api(kube).read_namespaced_lease("edl-sc-demand", namespace))
            return json.loads(raw["metadata"]["annotations"][REASON_ANNOTATION])["cause"]

        # The Lease carries the reason at its next renewal (a period), which may come after the status has it.
        wait_for(lambda: lease_reason() == "waiting", 10, "the Lease's reason: waiting", every=0.1, detail=lease_reason)
        assert lease_reason() == "waiting"
    finally:
        sidecar.stop()
    # Stopped, it handed the namespace on: the autoscaler Lease is gone (the demand lapses by itself).
    assert "edl-autoscaler" not in {ls.metadata.name for ls in
                                    client.CoordinationV1Api(kube).list_namespaced_lease(namespace).items}
    out = "\n".join(r.getMessage() for r in caplog.records if r.name == "edl.sidecar")
    assert re.search(r"handed [12] trainer\(s\) back to pods of a higher priority: \S*/web-[01] "
                     rf"\(1 pod, {re.escape(f'{web_cpu:g}')} CPU\)", out), out
    assert "scale sc" not in out and f"scale {namespace}/sc: 1 -> 3 trainers" in out
    # The hand-back: down to 1, in one decision or, when the informer shows the two service pods one
    # period apart, in two (3 -> 2 -> 1); never up again in between.
    sizes = [tuple(map(int, m)) for m in re.findall(r"scale \S+: (\d+) -> (\d+) trainers", out)]
    after_growth = sizes[sizes.index((1, 3)) + 1:]
    assert after_growth and after_growth[-1][1] == 1 and all(b < a for a, b in after_growth), out


def test_sidecar_holds_the_size_when_the_api_is_unreachable(digits, tmp_path, job_runner, plane, caplog):
    caplog.set_level(logging.INFO, logger="edl.sidecar")
    nowhere = token_client(plane, "x", host="https://127.0.0.1:1")  # nothing listens there
    job = job_runner("hold", job_args(digits, tmp_path)).start()
    job.wait_for(lambda s: s["world_size"] == 1, what="one trainer training")
    sidecar = start(job, nowhere, "ml", trainer_cpu=2)
    try:
        time.sleep(4)
        assert sidecar.sidecar.holding and sidecar.sidecar.decisions == 0  # holding, never planned
        st = job.status()
        assert st["desired_trainers"] == 1
        assert st["reason"]["cause"] == "held_api_away" and st["reason"]["text"].startswith("held at 1: "), st
    finally:
        sidecar.stop()
    out = "\n".join(r.getMessage() for r in caplog.records if r.name == "edl.sidecar")
    assert "holding 1 trainers" in out, out
