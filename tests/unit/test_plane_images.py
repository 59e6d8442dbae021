"""The plane's image build and its one copy of the images' layers, the parts that decide without a
registry or a node: what an image's build depends on, which layers an image has, how they unpack."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from tests.plane import images


def test_an_image_is_rebuilt_when_what_it_copies_changes_and_only_then(tmp_path):
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "a.py").write_text("a = 1\n")
    (tmp_path / "src" / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "other.txt").write_text("not copied\n")
    df = tmp_path / "Dockerfile"
    df.write_text("FROM base AS build\nCOPY pyproject.toml ./\nCOPY src ./src\nFROM base\n"
                  "COPY --from=build /install /usr/local\n")
    key = images.image_key(df, tmp_path, "base-1")
    (tmp_path / "other.txt").write_text("changed\n")
    (tmp_path / "src" / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (tmp_path / "src" / "pkg.egg-info").mkdir()  # an editable install's, as .dockerignore keeps it out
    (tmp_path / "src" / "pkg.egg-info" / "PKG-INFO").write_text("Version: 1\n")
    assert images.image_key(df, tmp_path, "base-1") == key
    assert images.image_key(df, tmp_path, "base-2") != key  # a new base
    (tmp_path / "src" / "pkg" / "a.py").write_text("a = 2\n")
    assert images.image_key(df, tmp_path, "base-1") != key


def test_a_copy_of_a_missing_file_is_named(tmp_path):
    df = tmp_path / "Dockerfile"
    df.write_text("FROM base\nCOPY nothing.txt /x\n")
    with pytest.raises(images.ImageError, match="COPY nothing.txt"):
        images.image_key(df, tmp_path, "b")


def test_the_shipped_cpu_images_share_the_official_python_base():
    assert images.base_reference() == "docker.io/library/python:3.11.11-slim-bookworm"
    assert [s.repo for s in images.shipped_specs()] == ["edl-runtime", "edl-trainer-cpu", "edl-trainer-torch-gpu",
                                                        "edl-storage-initializer"]


def test_the_build_context_leaves_out_what_the_image_key_leaves_out():
    ignored = (images.REPO / ".dockerignore").read_text().splitlines()
    assert "**/__pycache__" in ignored and "**/*.egg-info" in ignored


def blob(storage: Path, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    path = storage / "docker/registry/v2/blobs/sha256" / digest[:2] / digest / "data"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return f"sha256:{digest}"


def layer(files: dict[str, tuple[bytes, int, int]]) -> bytes:
    """A gzipped layer of ``path: (content, mode, uid)``, every file dated 1000."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, (data, mode, uid) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, uid, uid, 1000
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def registry_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The images' cache moved under ``tmp_path``, edl's version 1.0: an empty registry storage."""
    monkeypatch.setattr(images, "cache", lambda: tmp_path / "images")
    monkeypatch.setattr(images, "version", lambda: "1.0")
    return images.storage()


@pytest.fixture
def storage(tmp_path, monkeypatch) -> Path:
    return registry_storage(tmp_path, monkeypatch)


def tag(storage: Path, repo: str, layers: list[bytes]) -> list[str]:
    digests = [blob(storage, data) for data in layers]
    manifest = blob(storage, json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d} for d in digests]}).encode())
    link = storage / "docker/registry/v2/repositories" / repo / "_manifests/tags/1.0/current/link"
    link.parent.mkdir(parents=True)
    link.write_text(manifest)
    return digests


def test_an_images_layers_are_read_from_the_registrys_storage_base_first(storage):
    base = layer({"etc/debian_version": (b"12.0\n", 0o644, 0)})
    runtime = tag(storage, "edl-runtime", [base, layer({"usr/local/bin/edl": (b"#!/bin/sh\n", 0o755, 10001)})])
    assert images.layer_digests("edl-runtime", "1.0") == runtime
    assert images._blob(runtime[0]).read_bytes() == base


def test_an_image_the_registry_lacks_is_named(storage):
    with pytest.raises(images.ImageError, match="edl-runtime:1.0 is not in the registry's storage"):
        images.unpack_layers(("runtime",))
