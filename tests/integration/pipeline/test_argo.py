"""``pipelines/retrain.cronworkflow.yaml`` through Argo's real workflow controller on the plane.

Argo v4.0.5's controller and executor (``argoexec``) are built from Argo's Go module (test-only,
loopback only); its CRDs are installed with their full schemas, so the apiserver validates the
CronWorkflow. The controller turns each step into a pod with Argo's init and wait containers and
the emissary executor around the main container, and the loopback kubelet runs all three, the
executor binary included: output parameters and results travel as on a cluster
(WorkflowTaskResults written by the wait container under the workflow's ServiceAccount).
"""

from __future__ import annotations

import base64
import time

import pytest
import yaml
from kubernetes import client

from edl.cluster import manifests
from tests.plane import build
from tests.plane.fixtures import apply

pytestmark = pytest.mark.timeout(600)
NS = "default"  # where the CronWorkflow as committed runs (its step passes --namespace default)


@pytest.fixture(scope="session")
def argo(plane):
    try:
        build.build(build.ARGO_CONTROLLER, quiet=True)
        build.build(build.ARGOEXEC, quiet=True)
    except build.BuildError as e:
        pytest.fail(f"Argo cannot be built: {e}")
    plane.start_argo()
    return plane


def test_the_retraining_cronworkflow_runs_through_argo_and_publishes(argo, kube, plane_s3):
    core = client.CoreV1Api(kube)
    custom = client.CustomObjectsApi(kube)
    rbac = client.RbacAuthorizationV1Api(kube)
    cron = yaml.safe_load((build.REPO / "pipelines" / "retrain.cronworkflow.yaml").read_text())
    # What a user sets up: edl's RBAC, the S3 Secret the workflow names, and the CronWorkflow's own
    # ServiceAccount with the Role Argo's emissary executor needs and edl's launcher Role bound to it
    # (pipelines/retrain.cronworkflow.rbac.yaml, as compiled).
    apply(kube, manifests.rbac(NS), NS)
    core.create_namespaced_secret(NS, client.V1Secret(metadata=client.V1ObjectMeta(name="minio-creds"), data={
        k: base64.b64encode(v.encode()).decode() for k, v in plane_s3.env.items()}))
    workflow_rbac = list(yaml.safe_load_all((build.REPO / "pipelines" / "retrain.cronworkflow.rbac.yaml").read_text()))
    assert cron["spec"]["workflowSpec"]["serviceAccountName"] == "edl-retrain"
    apply(kube, workflow_rbac, NS)
    try:
        custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "cronworkflows", cron)
        # As `argo submit --from cronwf/edl-retrain` does: a Workflow from its spec, now.
        spec = dict(cron["spec"]["workflowSpec"])
        spec["arguments"] = {"parameters": [{"name": "registry_uri", "value": "s3://models/digits"},
                                            {"name": "epochs", "value": "3"}]}
        wf = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": "edl-retrain-",
                         "labels": {"workflows.argoproj.io/cron-workflow": "edl-retrain"}},
            "spec": spec})
        name = wf["metadata"]["name"]
        deadline = time.monotonic() + 480
        status: dict = {}
        while time.monotonic() < deadline:
            status = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
            status = status.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed", "Error"):
                break
            time.sleep(2)
        nodes = {n.get("displayName"): (n.get("phase"), n.get("message")) for n in (status.get("nodes") or {}).values()}
        if status.get("phase") != "Succeeded":
            failed = [p.metadata.name for p in core.list_namespaced_pod(
                NS, label_selector=f"workflows.argoproj.io/workflow={name}").items if p.status.phase == "Failed"]
            logs = {p: core.read_namespaced_pod_log(p, NS, container="main")[-1500:] for p in failed}
            raise AssertionError(f"workflow {status.get('phase')}: {status.get('message')}\n{nodes}\n{logs}")
        steps = {n["templateName"]: n for n in status["nodes"].values() if n.get("type") == "Pod"}
        assert set(steps) == {"prepare-data", "warm-start-from", "elastic-train", "evaluate", "publish-if-better"}
        accuracy = float(next(p["value"] for p in steps["evaluate"]["outputs"]["parameters"]
                              if p["name"] == "accuracy"))
        assert accuracy > 0.8
        import json

        info = json.loads(plane_s3.client().get_object("models", "digits/current.json").read())
        assert abs(info["accuracy"] - accuracy) < 1e-6  # published, being the first
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
