"""KServe's own controller (v0.16.0, built from its Go module, tools/kserve) on the plane, in raw-deployment
mode: the InferenceService the pipeline's deploy step creates is reconciled into a predictor Deployment that
runs edl's ServingRuntime (``edl serve`` on /mnt/models), and KServe's pod webhook, registered by URL with a
certificate from the plane's CA, gives each predictor pod the storage initializer with the S3 credentials the
step wired; the storage initializer (edl's image of kserve-storage) fetches the model from MinIO, the
InferenceService becomes Ready, and its predictor, asked over the Open Inference Protocol, scores the
held-out data as the evaluate step does."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from kubernetes import client

from edl.cluster.kube_api import KubeApi
from edl.data.dataset import Dataset
from edl.data.splits import resolve_splits
from edl.modeldef import load_model_def
from edl.pipeline.deploy import deploy_model, objects, wait_served
from edl.pipeline.tasks import evaluate_remote
from edl.serving.client import Served, infer, served_accuracy
from edl.serving.server import read_onnx
from tests.conftest import run_edl
from tests.plane import build
from tests.plane.fixtures import built
from tests.plane.plane import KSERVE_RUNTIME

pytestmark = pytest.mark.timeout(300)
STORAGE_INITIALIZER = "storage-initializer"  # edl's image of KServe's storage initializer (kserve-storage)


@pytest.fixture(scope="session")
def kserve(plane):
    built(build.KSERVE_MANAGER, "KServe's controller")
    plane.start_kserve(storage_initializer=plane.image(STORAGE_INITIALIZER), runtime=plane.image("runtime"))
    return plane


def _until(what: str, fetch, timeout_s: float = 90):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (found := fetch()) is not None:
            return found
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout_s:.0f} s")


def train(data: Path, checkpoint_uri: str, epochs: str, tmp_path: Path, seed: str = "0") -> str:
    """``edl train`` of the digits model into ``checkpoint_uri``; answers its model's URI."""
    trained = run_edl("train", "--job-name", f"kserve-{seed}", "--model-def", "edl.zoo.digits", "--data",
                      str(data / "train"), "--epochs", epochs, "--batch-size", "32", "--trainers", "1",
                      "--max-trainers", "1", "--seed", seed, "--checkpoint-uri", checkpoint_uri,
                      env={"EDL_HOME": str(tmp_path / f"home-{seed}")}, timeout=240)
    assert trained.returncode == 0, trained.stderr[-2000:]
    return f"{checkpoint_uri}/model"


def infer_locally(onnx_model: bytes, rows: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(onnx_model, providers=["CPUExecutionProvider"]).run(None, {"x": rows})[0]


def predictor_pods(core: client.CoreV1Api, namespace: str) -> list:
    return core.list_namespaced_pod(namespace, label_selector="serving.kserve.io/inferenceservice=digits").items


def test_kserves_controller_reconciles_the_deploy_steps_service_into_edls_runtime_with_its_s3_credentials(
        kserve, kube, namespace, plane_s3, tmp_path, monkeypatch):
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)
    # KServe's injected init container sets no securityContext: the restricted profile would refuse the pod.
    core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    for key, value in plane_s3.env.items():
        monkeypatch.setenv(key, value)  # the step's env: the S3 Secret's AWS_*
    # A model edl trained, in the cluster's MinIO, and its held-out accuracy as the evaluate step measures it.
    data = tmp_path / "digits"
    assert run_edl("data", "prepare", "digits", "--out", str(data)).returncode == 0
    model = train(data, "s3://ckpt/kserve-test", "3", tmp_path)
    accuracy = evaluate_remote(model, str(data), "edl.zoo.digits")
    uri = deploy_model(model, "s3://models/kserve-test", "digits", "run-1", namespace=namespace, api_client=kube)

    # The controller picks edl's runtime for the ONNX model over v2 and makes the predictor's Deployment.
    deployment = _until("the predictor's Deployment", lambda: next(iter(apps.list_namespaced_deployment(
        namespace, label_selector="serving.kserve.io/inferenceservice=digits").items), None))
    (container,) = deployment.spec.template.spec.containers
    assert container.name == "kserve-container" and container.image == kserve.image("runtime")
    # The repository's model (edl serve finds digits/1/model.onnx), on the pod's own address (the plane's pods
    # share one network).
    assert container.args == ["serve", "/mnt/models", "--name", "digits", "--port", "8080", "--host", "$(POD_IP)"]
    custom = client.CustomObjectsApi(kube)

    def predictor_condition():
        isvc = custom.get_namespaced_custom_object("serving.kserve.io", "v1beta1", namespace, "inferenceservices",
                                                   "digits")
        return next((c for c in isvc.get("status", {}).get("conditions", []) if c["type"] == "PredictorReady"), None)

    _until("the InferenceService's PredictorReady condition", predictor_condition)  # its status is KServe's

    # Its pods pass KServe's webhook: the storage initializer fetches the step's model into /mnt/models with
    # the Secret the step made for the predictor's ServiceAccount.
    pod = _until("a predictor pod", lambda: next(iter(predictor_pods(core, namespace)), None))
    (init,) = pod.spec.init_containers
    assert init.name == "storage-initializer" and init.image == kserve.image(STORAGE_INITIALIZER)
    assert init.args == [uri, "/mnt/models"]
    secret = core.read_namespaced_service_account(pod.spec.service_account_name, namespace).secrets[0].name
    env = {e.name: e for e in init.env}
    assert env["AWS_ACCESS_KEY_ID"].value_from.secret_key_ref.name == secret
    assert env["AWS_SECRET_ACCESS_KEY"].value_from.secret_key_ref.key == "AWS_SECRET_ACCESS_KEY"
    assert env["S3_ENDPOINT"].value == plane_s3.env["AWS_ENDPOINT_URL"].split("://", 1)[1]
    assert env["S3_USE_HTTPS"].value == "0"
    mounts = {c.name: {m.mount_path for m in c.volume_mounts or ()} for c in (init, *pod.spec.containers)}
    assert all("/mnt/models" in paths for paths in mounts.values()), mounts
    runtime = custom.get_cluster_custom_object(
        "serving.kserve.io", "v1alpha1", "clusterservingruntimes", KSERVE_RUNTIME)
    assert runtime["spec"]["protocolVersions"] == ["v2"]

    # The storage initializer fetches the model; edl serve answers on the pod's address once it is Ready.
    def ready():
        isvc = custom.get_namespaced_custom_object("serving.kserve.io", "v1beta1", namespace, "inferenceservices",
                                                   "digits")
        done = any(c["type"] == "Ready" and c["status"] == "True" for c in isvc.get("status", {}).get("conditions", []))
        return isvc if done else None

    _until("the InferenceService Ready", ready, timeout_s=180)
    (serving,) = [p for p in predictor_pods(core, namespace) if p.status.pod_ip]
    _, test = resolve_splits(str(data))
    x, y = load_model_def("edl.zoo.digits").collate(Dataset(test, "held-out data").read_all())
    served = Served(f"http://{serving.status.pod_ip}:8080/v2/models/digits", "digits")
    assert served_accuracy(served, x, y, 4) == pytest.approx(accuracy, abs=1.5 / len(y))

    # An InferenceService like the step's pointed straight at the model directory edl train wrote is served too.
    api = KubeApi(kube, namespace)
    for obj in objects("direct", namespace, model, plane_s3.env):
        api.apply(obj)
    wait_served(api, "direct", model, timeout_s=180)
    (direct,) = [p for p in core.list_namespaced_pod(
        namespace, label_selector="serving.kserve.io/inferenceservice=direct").items if p.status.pod_ip]
    assert served_accuracy(Served(f"http://{direct.status.pod_ip}:8080/v2/models/direct", "direct"), x, y, 4) == \
        pytest.approx(accuracy, abs=1.5 / len(y))

    # The next run's model: the service rolls over to it, and the old predictor stops answering.
    model2 = train(data, "s3://ckpt/kserve-test-2", "2", tmp_path, seed="7")
    uri2 = deploy_model(model2, "s3://models/kserve-test", "digits", "run-2", namespace=namespace, api_client=kube)

    def rolled_over():
        pods = predictor_pods(core, namespace)
        if len(pods) != 1 or pods[0].spec.init_containers[0].args[0] != uri2:
            return None
        ready = any(c.type == "Ready" and c.status == "True" for c in pods[0].status.conditions or ())
        return pods[0] if ready else None

    new = _until("the predictor of the next run's model, alone", rolled_over, timeout_s=180)
    rows = x[:16]
    want = infer_locally(read_onnx(model2), rows)
    got = infer(Served(f"http://{new.status.pod_ip}:8080/v2/models/digits", "digits"), rows)
    assert np.allclose(got, want, atol=1e-5)
    assert not np.allclose(got, infer_locally(read_onnx(model), rows), atol=1e-3)  # another model indeed
    # The old predictor is gone: nothing answers for its address any more (the node's bridge: the connection
    # times out or the host is unreachable).
    with pytest.raises((httpx.ConnectError, httpx.ConnectTimeout)):
        httpx.get(f"{served.url}/ready", timeout=5)


def test_a_model_kserve_cannot_fetch_fails_the_deploy_step_with_the_storage_initializers_reason(
        kserve, kube, namespace, plane_s3, tmp_path, monkeypatch):
    from edl.errors import PermanentError

    client.CoreV1Api(kube).patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    for key, value in plane_s3.env.items():
        monkeypatch.setenv(key, value)
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.onnx").write_bytes(b"not read: the predictor never gets it")
    # The Secret the step makes for KServe holds a key the bucket refuses.
    env = {**plane_s3.env, "AWS_SECRET_ACCESS_KEY": "not-the-key"}
    with pytest.raises(PermanentError) as e:
        deploy_model(str(model), "s3://models/kserve-refused", "refused", "run-1", namespace=namespace,
                     api_client=kube, env=env, wait_s=150)
    line = str(e.value)
    assert "\n" not in line and line.startswith("deploy: InferenceService refused cannot serve s3://models/")
    assert "storage-initializer of pod refused-predictor-" in line and "SignatureDoesNotMatch" in line, line


def test_the_deploy_step_run_as_a_pod_under_the_runs_account_serves_its_model(
        kserve, kube, namespace, plane_s3, tmp_path, monkeypatch):
    """The step as the pipeline runs it: in edl's runtime image, in the run's namespace, as an account that
    holds only the deployer's Role (its namespace from the pod's account, its API from in-cluster config), with
    the S3 Secret as its env; it returns once KServe serves the model."""
    from edl.cluster import manifests
    from tests.plane.fixtures import apply

    core = client.CoreV1Api(kube)
    core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    for key, value in plane_s3.env.items():
        monkeypatch.setenv(key, value)
    data = tmp_path / "digits"
    assert run_edl("data", "prepare", "digits", "--out", str(data)).returncode == 0
    model = train(data, "s3://ckpt/kserve-pod", "2", tmp_path, seed="3")
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "runner"}})
    apply(kube, manifests.deployer_rbac(namespace, ("runner",)), namespace)
    step = ("from edl.pipeline.deploy import deploy_model; "
            f"print(deploy_model({model!r}, 's3://models/kserve-pod', 'podstep', 'run-1'))")
    core.create_namespaced_pod(namespace, {"metadata": {"name": "deploy"}, "spec": {
        "serviceAccountName": "runner", "restartPolicy": "Never",
        "containers": [{"name": "main", "image": kserve.image("runtime"), "command": ["python", "-c", step],
                        "envFrom": [{"secretRef": {"name": "minio"}}]}]}})

    def finished():
        phase = core.read_namespaced_pod("deploy", namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = _until("the deploy step's pod to finish", finished, timeout_s=240)
    log = core.read_namespaced_pod_log("deploy", namespace)
    assert phase == "Succeeded", log[-3000:]
    assert log.strip().splitlines()[-1] == "s3://models/kserve-pod/serving/run-1"
    (serving,) = [p for p in core.list_namespaced_pod(
        namespace, label_selector="serving.kserve.io/inferenceservice=podstep").items if p.status.pod_ip]
    _, test = resolve_splits(str(data))
    x, y = load_model_def("edl.zoo.digits").collate(Dataset(test, "held-out data").read_all())
    served = Served(f"http://{serving.status.pod_ip}:8080/v2/models/podstep", "podstep")
    accuracy = evaluate_remote(model, str(data), "edl.zoo.digits")
    assert served_accuracy(served, x, y, 4) == pytest.approx(accuracy, abs=1.5 / len(y))
