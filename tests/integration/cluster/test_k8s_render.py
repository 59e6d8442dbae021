"""``edl k8s render`` as a user runs it: valid files, or one line naming the culprit and nothing written."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from tests.conftest import run_edl
from tests.unit.cluster.test_manifests import K8S_VERSION

pytestmark = pytest.mark.timeout(60)


def test_render_command_writes_valid_files(tmp_path):
    out = tmp_path / "k8s"
    args = ["k8s", "render", "--job-name", "mnist", "--model-def", "edl.zoo.digits", "--data", "s3://d/digits",
            "--epochs", "2", "--batch-size", "32", "--checkpoint-uri", "s3://c/mnist", "--s3-secret", "minio",
            "--namespace", "ml", "--image", "reg.example/edl-runtime:0.1.0", "--out", str(out)]
    r = run_edl(*args)
    assert r.returncode == 0, r.stderr
    files = sorted(p.name for p in out.iterdir())
    assert files == ["00-rbac.yaml", "10-token-secret.yaml", "20-master-service.yaml", "30-master-pod.yaml",
                     "40-trainer-template.yaml", "50-network-policies.yaml"]
    kinds = []
    for p in sorted(out.iterdir()):
        for obj in yaml.safe_load_all(p.read_text()):
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            kinds.append(obj["kind"])
    assert kinds.count("ServiceAccount") == 2 and "PodTemplate" in kinds and kinds.count("NetworkPolicy") == 2

    bad = tmp_path / "bad"
    r = run_edl(*[a if a != "s3://c/mnist" else "file:///tmp/c" for a in args[:-1]], str(bad))
    assert r.returncode == 2 and "--checkpoint-uri" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not bad.exists()  # nothing written


def test_the_trainers_image_follows_the_framework_the_model_definition_imports(tmp_path):
    """edl's trainer image for PaddlePaddle or PyTorch, the GPU build with --trainer-gpu; a model
    definition whose framework cannot be read needs --trainer-image, and says so in one line."""
    from edl.api.images import DEFAULT_IMAGES

    def trainer_image(model_def: str, *more: str) -> tuple[int, str]:
        out = tmp_path / f"k8s-{len(list(tmp_path.iterdir()))}"
        r = run_edl("k8s", "render", "--job-name", "mnist", "--model-def", model_def, "--data", "s3://d/x",
                    "--epochs", "1", "--batch-size", "32", "--checkpoint-uri", "s3://c/x", "--s3-secret", "minio",
                    *more, "--out", str(out))
        if r.returncode:
            assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1 and not out.exists()
            return r.returncode, r.stderr
        template = yaml.safe_load((out / "40-trainer-template.yaml").read_text())
        return 0, template["template"]["spec"]["containers"][0]["image"]

    assert trainer_image("edl.zoo.mlp") == (0, DEFAULT_IMAGES.trainer_cpu)
    assert trainer_image("edl.zoo.torch.mlp") == (0, DEFAULT_IMAGES.trainer("torch", 0))
    assert trainer_image("edl.zoo.torch.mlp", "--trainer-gpu", "1") == (0, DEFAULT_IMAGES.trainer("torch", 1))
    assert DEFAULT_IMAGES.trainer("torch", 0).endswith("/edl-trainer-torch-cpu:0.1.0")
    own = tmp_path / "mine.py"  # its framework comes from a module of its own, not read here
    own.write_text("from mynets import model, loss, optimizer, collate\n")
    code, err = trainer_image(str(own))
    assert code == 2 and "--trainer-image empty, and edl cannot tell the model definition's framework" in err
    assert trainer_image(str(own), "--trainer-image", "reg.example/mine:1") == (0, "reg.example/mine:1")


def test_render_binds_the_launcher_role_to_the_accounts_workflows_run_under(tmp_path):
    """Review #6: KFP runs every pod of a run (its driver too) under the run's account, so edl's Role is
    bound to that account (pipeline-runner standalone, default-editor in a profile namespace) instead of
    KFP being asked to run as edl-launcher. Only bindings are added: the Roles stay what they were."""
    base = ["k8s", "render", "--job-name", "mnist", "--model-def", "edl.zoo.digits", "--data", "s3://d/digits",
            "--epochs", "2", "--batch-size", "32", "--checkpoint-uri", "s3://c/mnist", "--s3-secret", "minio",
            "--namespace", "ml"]
    assert run_edl(*base, "--out", str(tmp_path / "plain")).returncode == 0
    r = run_edl(*base, "--bind-account", "pipeline-runner", "--bind-account", "default-editor",
                "--out", str(tmp_path / "kfp"))
    assert r.returncode == 0, r.stderr
    plain = list(yaml.safe_load_all((tmp_path / "plain" / "00-rbac.yaml").read_text()))
    bound = list(yaml.safe_load_all((tmp_path / "kfp" / "00-rbac.yaml").read_text()))
    assert bound[:len(plain)] == plain  # everything as before, then only the new bindings
    extra = bound[len(plain):]
    for obj in extra:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    got = {(o["kind"], o["roleRef"]["kind"], o["roleRef"]["name"], o["subjects"][0]["name"],
            o["subjects"][0]["namespace"]) for o in extra}
    assert got == {(kind, ref, role, account, "ml") for account in ("pipeline-runner", "default-editor")
                   for kind, ref, role in (("RoleBinding", "Role", "edl-launcher"),
                                           ("ClusterRoleBinding", "ClusterRole", "edl-launcher-priorityclasses"))}
    assert not any(o["kind"] == "ServiceAccount" and o["metadata"]["name"] in ("pipeline-runner", "default-editor")
                   for o in bound)  # KFP owns those accounts
    r = run_edl(*base, "--bind-account", "Pipeline Runner", "--out", str(tmp_path / "bad"))
    assert r.returncode == 2 and "--bind-account 'Pipeline Runner'" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()
