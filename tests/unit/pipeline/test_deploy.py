"""The deploy step's objects (KServe's S3 wiring, the InferenceService), its model repository, its Role."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from edl.errors import UserError

REPO = Path(__file__).resolve().parents[3]
ENV = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_ENDPOINT_URL": "http://minio.ml:9000"}


@pytest.mark.parametrize("endpoint, host, https", [
    ("http://minio.ml:9000", "minio.ml:9000", "0"),
    ("https://s3.us-east-2.amazonaws.com", "s3.us-east-2.amazonaws.com", "1"),
    ("minio.ml:9000", "minio.ml:9000", "1"),  # no scheme: https, as boto's default
])
def test_kserves_s3_annotations_come_from_the_s3_secrets_endpoint(endpoint, host, https):
    from edl.pipeline.deploy import s3_annotations

    a = s3_annotations({**ENV, "AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "eu-west-1"})
    assert a == {"serving.kserve.io/s3-endpoint": host, "serving.kserve.io/s3-usehttps": https,
                 "serving.kserve.io/s3-verifyssl": https, "serving.kserve.io/s3-region": "eu-west-1"}
    assert s3_annotations({"AWS_ACCESS_KEY_ID": "x"}) == {"serving.kserve.io/s3-region": "us-east-1"}  # AWS itself


def test_the_inference_service_reads_the_onnx_repository_with_the_accounts_credentials():
    from edl.pipeline.deploy import objects

    secret, account, isvc = objects("digits", "ml", "s3://models/digits/serving/run-1", ENV, "s3://m/run-1/model")
    assert secret["stringData"] == {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"}
    assert secret["metadata"]["annotations"]["serving.kserve.io/s3-endpoint"] == "minio.ml:9000"
    assert account["secrets"] == [{"name": secret["metadata"]["name"]}]
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    predictor = isvc["spec"]["predictor"]
    assert predictor["serviceAccountName"] == account["metadata"]["name"]
    assert predictor["model"]["modelFormat"] == {"name": "onnx"} and predictor["model"]["protocolVersion"] == "v2"
    assert predictor["model"]["storageUri"] == "s3://models/digits/serving/run-1"
    with pytest.raises(UserError, match="no AWS_SECRET_ACCESS_KEY"):
        objects("digits", "ml", "s3://x", {"AWS_ACCESS_KEY_ID": "id"})


def test_the_repository_is_tritons_layout_and_a_model_without_onnx_is_refused(tmp_path):
    from edl.pipeline.deploy import deploy_model, publish_repository

    model = tmp_path / "model"
    model.mkdir()
    (model / "params.npz").write_bytes(b"weights")
    with pytest.raises(UserError, match="has no model.onnx"):
        publish_repository(str(model), str(tmp_path / "registry"), "digits", "run-1")
    (model / "model.onnx").write_bytes(b"onnx bytes")
    uri = publish_repository(str(model), str(tmp_path / "registry"), "digits", "run-1")
    assert Path(uri.removeprefix("file://")) == tmp_path / "registry" / "serving" / "run-1"
    assert (tmp_path / "registry" / "serving" / "run-1" / "digits" / "1" / "model.onnx").read_bytes() == b"onnx bytes"
    with pytest.raises(UserError, match="deploy_name: 'Digits_1'"):
        deploy_model(str(model), "s3://models/x", "Digits_1", "run-1", namespace="ml", env=ENV)
    with pytest.raises(UserError, match="registry_uri: .* needs an s3:// registry"):
        deploy_model(str(model), str(tmp_path / "registry"), "digits", "run-1", namespace="ml", env=ENV)


def test_the_deploy_step_gets_the_s3_secret_as_env():
    doc, platform = yaml.safe_load_all((REPO / "pipelines" / "retrain.pipeline.yaml").read_text())
    (secret,) = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-deploy"]["secretAsEnv"]
    assert {k["envVar"] for k in secret["keyToEnv"]} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                          "AWS_ENDPOINT_URL"}


def test_the_deployer_role_is_rendered_only_when_asked_for_and_holds_only_what_deploy_uses(tmp_path):
    from edl.cli import main
    from edl.cluster.manifests import deployer_rbac

    assert deployer_rbac("ml", ()) == []
    role, binding = deployer_rbac("ml", ("pipeline-runner", "pipeline-runner"))
    assert {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"]} == {
        ("serving.kserve.io", "inferenceservices"): {"get", "create", "update"},
        ("", "secrets"): {"get", "create", "update"}, ("", "serviceaccounts"): {"get", "create", "update"},
        ("", "pods"): {"list"}}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "ml"}]
    base = ["k8s", "render", "--job", "j", "--model-def", "edl.zoo.digits", "--data", "s3://d/x",
            "--checkpoint-uri", "s3://c/x", "--s3-secret", "minio", "--namespace", "ml", "--epochs", "1", "--batch-size", "8"]
    assert main([*base, "--out", str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / "01-deploy-rbac.yaml").exists()
    assert main([*base, "--out", str(tmp_path / "deploy"), "--bind-deployer", "pipeline-runner"]) == 0
    assert list(yaml.safe_load_all((tmp_path / "deploy" / "01-deploy-rbac.yaml").read_text())) == [role, binding]


NEW, OLD = "s3://models/serving/run-2", "s3://models/serving/run-1"


def pod(name: str, uri: str, ready: bool = False, init_exit: int | None = None, message: str = "") -> dict:
    status: dict = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if init_exit is not None:
        status["initContainerStatuses"] = [{"name": "storage-initializer", "state": {"waiting": {}},
                                            "lastState": {"terminated": {"exitCode": init_exit, "message": message}}}]
    return {"metadata": {"name": name}, "status": status,
            "spec": {"initContainers": [{"name": "storage-initializer", "args": [uri, "/mnt/models"]}]}}


def isvc(ready: bool, message: str = "") -> dict:
    return {"status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"},
                                      {"type": "PredictorReady", "status": "True" if ready else "False",
                                       "message": message}]}}


def test_serving_is_ready_only_when_kserve_says_so_and_only_the_new_models_predictors_are_ready():
    from edl.pipeline.deploy import serving_state

    assert serving_state(isvc(False), [], NEW).waiting == "a predictor pod of this model"
    rolling = serving_state(isvc(True), [pod("p-old", OLD, ready=True), pod("p-new", NEW, ready=True)], NEW)
    assert not rolling.ready and rolling.waiting == "the earlier model's predictors to stop (p-old)"
    starting = serving_state(isvc(False, "Deployment does not have minimum availability."), [pod("p-new", NEW)], NEW)
    assert not starting.ready and "PredictorReady: Deployment does not have minimum availability." in starting.waiting
    assert serving_state(isvc(True), [pod("p-new", NEW, ready=True)], NEW).ready


def test_a_storage_initializer_that_cannot_fetch_the_model_is_one_line_naming_the_pod():
    from edl.pipeline.deploy import serving_state

    log = "INFO Copying contents of s3://models/serving/run-2 to local\nstorage-initializer: s3://models/...: " \
          "An error occurred (InvalidAccessKeyId) when calling the ListObjects operation\n"
    state = serving_state(isvc(False), [pod("p-new", NEW, init_exit=1, message=log)], NEW)
    assert state.failure == ("storage-initializer of pod p-new failed: storage-initializer: s3://models/...: An error "
                             "occurred (InvalidAccessKeyId) when calling the ListObjects operation")
    assert serving_state(isvc(False), [pod("p-new", NEW, init_exit=137)], NEW).failure.endswith("exit code 137")
    # An earlier model's pod that failed is not this model's failure.
    assert serving_state(isvc(False), [pod("p-old", OLD, init_exit=1)], NEW).failure is None


def test_the_step_waits_for_kserve_and_gives_up_naming_what_it_waited_for():
    from edl.errors import PermanentError
    from edl.pipeline.deploy import wait_served

    class Api:
        def __init__(self, answers: list[tuple[dict, list[dict]]]) -> None:
            self.answers = answers

        def get(self, resource: str, name: str) -> dict:
            return self.answers[0][0]

        def list(self, resource: str, selector: str) -> list[dict]:
            assert selector == "serving.kserve.io/inferenceservice=digits"
            return self.answers.pop(0)[1] if len(self.answers) > 1 else self.answers[0][1]

    now = [0.0]
    sleep = lambda s: now.__setitem__(0, now[0] + s)  # noqa: E731
    wait_served(Api([(isvc(False), []), (isvc(True), [pod("p", NEW, ready=True)])]), "digits", NEW, 60,
                clock=lambda: now[0], sleep=sleep)
    with pytest.raises(PermanentError, match=r"not serving s3://models/serving/run-2 after 60 s; waiting for a "
                                             r"predictor pod of this model"):
        wait_served(Api([(isvc(False), [])]), "digits", NEW, 60, clock=lambda: now[0], sleep=sleep)
