"""Which file ``edl serve`` serves from a model directory or a model repository (``onnx_file``)."""

from __future__ import annotations

import pytest

pytest.importorskip("kserve")  # edl.serving.server needs the serve extra

from edl.serving.server import onnx_file  # noqa: E402


def test_an_exported_models_own_onnx_file_comes_first():
    assert onnx_file(["model.onnx", "params.npz", "digits/1/model.onnx"], "digits") == "model.onnx"


def test_in_a_repository_the_highest_version_of_the_named_model():
    files = ["digits/1/model.onnx", "digits/10/model.onnx", "digits/2/model.onnx", "other/99/model.onnx"]
    assert onnx_file(files, "digits") == "digits/10/model.onnx"
    assert onnx_file(files, "iris") is None
    assert onnx_file(["params.npz", "digits/v1/model.onnx"], "digits") is None
