"""The one line a trainer logs when paddle2onnx cannot convert a model."""

from __future__ import annotations

from edl.frameworks.paddle.onnx_export import _reason

ABORTED = """[Paddle2ONNX] Start parsing the Paddle model file...
[Paddle2ONNX]\x20
[ERROR][Paddle2ONNX] Due to the unsupported operators, the conversion is aborted.

--------------------------------------
C++ Traceback (most recent call last):
FatalError: `Process abort signal` is detected by the operating system.
"""


def test_the_converters_own_error_line_is_the_reason():
    assert _reason(-6, ABORTED) == "Due to the unsupported operators, the conversion is aborted."
    assert _reason(1, "noise\nedl-onnx: paddle2onnx could not convert the model (its log above)\n") == (
        "paddle2onnx could not convert the model (its log above)")


def test_without_an_error_line_the_exit_is_the_reason():
    assert _reason(-9, "Killed\n") == "paddle2onnx failed (signal 9)"
    assert _reason(3, "") == "paddle2onnx failed (exit 3)"
