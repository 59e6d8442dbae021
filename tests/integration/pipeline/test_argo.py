"""``pipelines/retrain.cronworkflow.yaml`` through Argo's real workflow controller on the plane.

Argo v4.0.5's controller and executor (``argoexec``) are built from Argo's Go module (test-only,
loopback only); its CRDs are installed with their full schemas, so the apiserver validates the
CronWorkflow. The controller turns each step into a pod with Argo's init and wait containers and
the emissary executor around the main container, and a node's kubelet runs all three under containerd from
their images (Argo's executor image made from the binary, ``tools/argo/Containerfile``; edl's
from ``images/``, the workflow compiled for the plane's registry): output parameters and results travel as on a cluster
(WorkflowTaskResults written by the wait container under the workflow's ServiceAccount).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time

import pytest
import yaml
from kubernetes import client

from edl.api.images import DEFAULT_REGISTRY
from edl.cluster import manifests
from tests.plane import build, images
from tests.plane.fixtures import apply

pytestmark = pytest.mark.timeout(600)
NS = "default"  # where the CronWorkflow as committed runs (its step passes --namespace default)


@pytest.fixture(scope="session")
def argo(plane):
    try:
        build.build(build.ARGO_CONTROLLER, quiet=True)
        build.build(build.ARGOEXEC, quiet=True)
        images.build_images(quiet=True)  # the executor's image, once its binary is built
    except (build.BuildError, images.ImageError) as e:
        pytest.fail(f"Argo cannot be built: {e}")
    plane.start_argo()
    return plane


@pytest.fixture(scope="session")
def edl_rbac_in_ns(argo, kube):
    """edl's RBAC in ``NS``, once: it stays for the session (its cluster bindings are shared)."""
    apply(kube, manifests.rbac(NS), NS)


@pytest.fixture
def retrain(argo, kube, plane, plane_s3, edl_rbac_in_ns, tmp_path):
    """The CronWorkflow as ``edl pipeline compile --registry`` writes it for the plane's registry (the
    committed one, with edl's images from there), created in ``NS``, with what a user sets up: edl's RBAC, the S3
    Secret the workflow names, and the CronWorkflow's own ServiceAccount with the Role Argo's
    emissary executor needs and edl's launcher Role bound to it (pipelines/retrain.cronworkflow.rbac.yaml,
    as compiled). Everything removed afterwards."""
    core = client.CoreV1Api(kube)
    custom = client.CustomObjectsApi(kube)
    rbac = client.RbacAuthorizationV1Api(kube)
    compiled = subprocess.run([sys.executable, "-m", "edl", "pipeline", "compile", "--registry", plane.state.registry,
                               "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert compiled.returncode == 0, compiled.stderr
    cron = yaml.safe_load((tmp_path / "retrain.cronworkflow.yaml").read_text())
    committed = yaml.safe_load((build.REPO / "pipelines" / "retrain.cronworkflow.yaml").read_text())
    assert json.dumps(cron).replace(plane.state.registry, DEFAULT_REGISTRY) == json.dumps(committed)
    core.create_namespaced_secret(NS, client.V1Secret(metadata=client.V1ObjectMeta(name="minio-creds"), data={
        k: base64.b64encode(v.encode()).decode() for k, v in plane_s3.env.items()}))
    workflow_rbac = list(yaml.safe_load_all((tmp_path / "retrain.cronworkflow.rbac.yaml").read_text()))
    assert cron["spec"]["workflowSpec"]["serviceAccountName"] == "edl-retrain"
    apply(kube, workflow_rbac, NS)
    try:
        custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "cronworkflows", cron)
        yield cron
    finally:
        for plural in ("workflows", "cronworkflows"):
            for obj in custom.list_namespaced_custom_object("argoproj.io", "v1alpha1", NS, plural)["items"]:
                custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", NS, plural, obj["metadata"]["name"])
        core.delete_namespaced_secret("minio-creds", NS)
        for obj in workflow_rbac:
            name, kind = obj["metadata"]["name"], obj["kind"]
            try:
                {"ServiceAccount": lambda: core.delete_namespaced_service_account(name, NS),
                 "Role": lambda: rbac.delete_namespaced_role(name, NS),
                 "RoleBinding": lambda: rbac.delete_namespaced_role_binding(name, NS),
                 "ClusterRoleBinding": lambda: rbac.delete_cluster_role_binding(name)}[kind]()
            except client.ApiException:
                pass
        deadline = time.monotonic() + 90
        while core.list_namespaced_pod(NS).items and time.monotonic() < deadline:
            time.sleep(1)  # the workflow's pods go with it (owned by the Workflow)


def run_from_cron(kube, cron: dict, params: dict[str, str], timeout_s: float = 480) -> dict:
    """As `argo submit --from cronwf/edl-retrain` does: a Workflow from its spec, now; waits for it
    to end and returns it (failing with the failed steps' logs unless it succeeded)."""
    core = client.CoreV1Api(kube)
    custom = client.CustomObjectsApi(kube)
    spec = dict(cron["spec"]["workflowSpec"])
    spec["arguments"] = {"parameters": [{"name": k, "value": v} for k, v in params.items()]}
    wf = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"generateName": "edl-retrain-",
                     "labels": {"workflows.argoproj.io/cron-workflow": cron["metadata"]["name"]}},
        "spec": spec})
    name = wf["metadata"]["name"]
    deadline = time.monotonic() + timeout_s
    status: dict = {}
    while time.monotonic() < deadline:
        wf = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
        status = wf.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed", "Error"):
            break
        time.sleep(2)
    nodes = {n.get("displayName"): (n.get("phase"), n.get("message")) for n in (status.get("nodes") or {}).values()}
    if status.get("phase") != "Succeeded":
        failed = [p.metadata.name for p in core.list_namespaced_pod(
            NS, label_selector=f"workflows.argoproj.io/workflow={name}").items if p.status.phase == "Failed"]
        logs = {p: core.read_namespaced_pod_log(p, NS, container="main")[-1500:] for p in failed}
        raise AssertionError(f"workflow {status.get('phase')}: {status.get('message')}\n{nodes}\n{logs}")
    return wf


def pod_steps(wf: dict) -> dict[str, dict]:
    return {n["templateName"]: n for n in wf["status"]["nodes"].values() if n.get("type") == "Pod"}


def output(step: dict, name: str) -> str:
    return next(p["value"] for p in step["outputs"]["parameters"] if p["name"] == name)


def train_step(kube, wf: dict) -> tuple[dict[str, str], str]:
    """The elastic-train step's flags and its main container's log."""
    core = client.CoreV1Api(kube)
    pods = core.list_namespaced_pod(NS, label_selector=f"workflows.argoproj.io/workflow={wf['metadata']['name']}")
    [pod] = [p for p in pods.items if (p.metadata.annotations or {}).get("workflows.argoproj.io/node-name", "")
             .split(".")[-1].startswith("elastic-train")]  # "WF[2].elastic-train(0)": a retried node
    main = next(c for c in pod.spec.containers if c.name == "main")
    args = [*(main.command or []), *(main.args or [])]  # the emissary executor wraps the command
    flags = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    return flags, core.read_namespaced_pod_log(pod.metadata.name, NS, container="main")


def test_the_retraining_cronworkflow_runs_twice_each_run_trains_and_the_second_warm_starts_from_the_first(
        retrain, kube, plane_s3):
    """Two runs of the CronWorkflow in a row, as its schedule fires them: every step a pod of Argo's
    controller; the first prepares, trains, evaluates (its accuracy travelling as an output
    parameter through a WorkflowTaskResult) and publishes, being the first; each run is its own job
    with its own checkpoints and trains its epochs; the second starts from the model the first published."""
    s3 = plane_s3.client()
    params = {"registry_uri": "s3://models/digits-twice", "epochs": "2"}
    first = run_from_cron(kube, retrain, params)
    assert set(pod_steps(first)) == {"prepare-data", "warm-start-from", "elastic-train", "evaluate",
                                     "publish-if-better"}
    assert float(output(pod_steps(first)["evaluate"], "accuracy")) > 0.8
    published = json.loads(s3.get_object("models", "digits-twice/current.json").read())
    second = run_from_cron(kube, retrain, params)
    runs = []
    for wf in (first, second):
        flags, log = train_step(kube, wf)
        job, ckpt = flags["--job-name"], flags["--checkpoint-uri"]
        assert wf["metadata"]["uid"] in job and wf["metadata"]["uid"] in ckpt  # per workflow
        done = re.search(rf"job {re.escape(job)} succeeded\S*: (\d+) epochs, (\d+) steps", log)
        assert done and int(done[1]) == 2 and int(done[2]) > 0, log[-2000:]  # it trained, not "nothing to do"
        bucket, prefix = ckpt.removeprefix("s3://").split("/", 1)
        owner = json.loads(s3.get_object(bucket, f"{prefix}/edl-owner.json").read())
        assert owner["job"] == job
        runs.append((job, ckpt, flags["--init-model"], pod_steps(wf)))
    (job1, ckpt1, warm1, steps1), (job2, ckpt2, warm2, steps2) = runs
    assert job1 != job2 and ckpt1 != ckpt2
    assert warm1 == "" and output(steps1["warm-start-from"], "uri") == ""  # nothing published yet
    # The second starts from what the first published: the registry's current model, the first's.
    assert published["source"] == f"{ckpt1}/model"
    assert warm2 == "s3://models/digits-twice/current" == output(steps2["warm-start-from"], "uri")
    assert abs(published["accuracy"] - float(output(steps1["evaluate"], "accuracy"))) < 1e-6
