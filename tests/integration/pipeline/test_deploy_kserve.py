"""The pipeline's deploy step against the real apiserver with KServe's InferenceService CRD (v0.16.0,
its full schema from KServe's Go module, tools/kserve): what the step creates is accepted, a second
run updates it in place, the schema is enforced, and the step's Role is what it needs.

This checks the objects, the step's rights and the S3 layout (the step does not wait to be served:
``wait_s=0``); serving them is ``test_kserve_controller.py``'s, with KServe's controller (which, when it
runs on the same plane, also reconciles what this test creates)."""

from __future__ import annotations

import subprocess
import time

import pytest
from kubernetes import client, config

from edl.cluster import manifests
from edl.cluster.kube_api import KubeApi
from edl.errors import KubeForbiddenError, KubeRefusedError
from edl.pipeline.deploy import deploy_model, inference_service
from tests.plane import build

pytestmark = pytest.mark.timeout(300)
RUNNER = "pipeline-runner"  # the account a KFP run's steps run under (standalone KFP)


@pytest.fixture(scope="session")
def kserve_crd(plane):
    """KServe's InferenceService CRD installed (server-side apply: idempotent) and established. The CRD
    file comes from the build step (``python -m tests.plane.build``, which ``./dev test`` runs first)."""
    try:
        crd = build.fetch(build.KSERVE_CRD)  # in the cache already after the build step: no download here
    except build.BuildError as e:
        pytest.fail(f"KServe's CRD: {e}")
    kubectl = [str(plane.bin / "kubectl"), f"--kubeconfig={plane.admin_kubeconfig}"]
    r = subprocess.run([*kubectl, "apply", "--server-side", "-f", str(crd)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ext = client.ApiextensionsV1Api(config.new_client_from_config(config_file=str(plane.admin_kubeconfig)))
    deadline = time.monotonic() + 60  # (kubectl wait fails while the CRD has no conditions yet)
    while time.monotonic() < deadline:
        crd_status = ext.read_custom_resource_definition("inferenceservices.serving.kserve.io").status
        if any(c.type == "Established" and c.status == "True" for c in (crd_status.conditions or [])):
            return
        time.sleep(0.5)
    pytest.fail("KServe's InferenceService CRD not established within 60 s")


def _as(plane, namespace: str, account: str) -> client.ApiClient:
    """An API client that acts as ``account`` of ``namespace`` (the admin impersonating it): what the
    step's pod would be allowed, nothing more."""
    api = config.new_client_from_config(config_file=str(plane.admin_kubeconfig))
    api.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:{account}")
    return api


def test_the_deploy_step_creates_then_updates_the_inference_service_as_the_runs_account(
        plane, kube, namespace, plane_s3, kserve_crd, tmp_path, monkeypatch):
    for key, value in plane_s3.env.items():
        monkeypatch.setenv(key, value)  # the step's env: the S3 Secret's AWS_* (kfp-kubernetes puts them there)
    core = client.CoreV1Api(kube)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": RUNNER}})
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.onnx").write_bytes(b"an ONNX file's bytes")  # the step copies it; Triton would load it
    registry = "s3://models/deploy-test"
    runner = _as(plane, namespace, RUNNER)

    # Least privilege: the launcher's Role alone does not let the run's account deploy.
    from tests.plane.fixtures import apply

    apply(kube, [b for b in manifests.launcher_bindings(namespace, RUNNER) if b["kind"] == "RoleBinding"], namespace)
    with pytest.raises(KubeForbiddenError):
        deploy_model(str(model), registry, "digits", "run-1", namespace=namespace, api_client=runner,
                         wait_s=0)
    apply(kube, manifests.deployer_rbac(namespace, (RUNNER,)), namespace)

    first = deploy_model(str(model), registry, "digits", "run-1", namespace=namespace, api_client=runner,
                         wait_s=0)
    assert first == f"{registry}/serving/run-1"
    s3 = plane_s3.client()
    assert s3.get_object("models", "deploy-test/serving/run-1/digits/1/model.onnx").read() == b"an ONNX file's bytes"
    custom = client.CustomObjectsApi(kube)
    isvc = custom.get_namespaced_custom_object("serving.kserve.io", "v1beta1", namespace, "inferenceservices", "digits")
    predictor = isvc["spec"]["predictor"]
    assert predictor["model"]["storageUri"] == first and predictor["model"]["modelFormat"]["name"] == "onnx"
    account = core.read_namespaced_service_account(predictor["serviceAccountName"], namespace)
    (secret_ref,) = account.secrets
    secret = core.read_namespaced_secret(secret_ref.name, namespace)
    endpoint = plane_s3.env["AWS_ENDPOINT_URL"]
    assert secret.metadata.annotations["serving.kserve.io/s3-endpoint"] == endpoint.split("://", 1)[1]
    assert secret.metadata.annotations["serving.kserve.io/s3-usehttps"] == ("1" if endpoint.startswith("https") else "0")
    assert set(secret.data) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}

    # The next run's model: the same service, pointed at the new repository (an update, not a second one).
    second = deploy_model(str(model), registry, "digits", "run-2", namespace=namespace, api_client=runner,
                         wait_s=0)
    again = custom.get_namespaced_custom_object("serving.kserve.io", "v1beta1", namespace, "inferenceservices", "digits")
    assert again["spec"]["predictor"]["model"]["storageUri"] == second == f"{registry}/serving/run-2"
    assert again["metadata"]["uid"] == isvc["metadata"]["uid"] and again["metadata"]["generation"] == 2
    assert len(custom.list_namespaced_custom_object("serving.kserve.io", "v1beta1", namespace,
                                                    "inferenceservices")["items"]) == 1

    # The CRD's schema is enforced: a model format that is not an object is refused by the apiserver (422),
    # or first by KServe's defaulting webhook where its controller runs on this plane too (400).
    bad = inference_service("broken", namespace, second)
    bad["spec"]["predictor"]["model"]["modelFormat"] = "onnx"
    with pytest.raises(KubeRefusedError, match="HTTP (422|400)"):
        KubeApi(runner, namespace).apply(bad)
