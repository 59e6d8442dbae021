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
        ("", "secrets"): {"get", "create", "update"}, ("", "serviceaccounts"): {"get", "create", "update"}}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "ml"}]
    base = ["k8s", "render", "--job", "j", "--model-def", "edl.zoo.digits", "--data", "s3://d/x",
            "--checkpoint-uri", "s3://c/x", "--s3-secret", "minio", "--namespace", "ml", "--epochs", "1", "--batch-size", "8"]
    assert main([*base, "--out", str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / "01-deploy-rbac.yaml").exists()
    assert main([*base, "--out", str(tmp_path / "deploy"), "--bind-deployer", "pipeline-runner"]) == 0
    assert list(yaml.safe_load_all((tmp_path / "deploy" / "01-deploy-rbac.yaml").read_text())) == [role, binding]
