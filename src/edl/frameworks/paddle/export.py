"""A PaddlePaddle model out of the trainer: ``paddle.jit.save``'s inference model, and the same as ONNX."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import paddle

from edl.frameworks.paddle.onnx_export import convert
from edl.storage.checkpoint import ONNX_FILE


def export_inference(model: paddle.nn.Layer, sample_input: Any, out: Path) -> str | None:
    """Write the inference model (``inference.json``, ``inference.pdiparams``) and ``model.onnx`` into
    ``out``; answers why there is no ONNX model, or ``None``. ``sample_input``: a batch of one, for the
    input spec (any batch size)."""
    from paddle.static import InputSpec

    prefix = out / "inference"
    model.eval()
    try:
        spec = [InputSpec([None, *sample_input.shape[1:]], str(sample_input.dtype), "x")]  # type: ignore[arg-type]
        paddle.jit.save(model, str(prefix), input_spec=spec)
    finally:
        model.train()
    program = next(p for p in (prefix.with_suffix(".json"), prefix.with_suffix(".pdmodel")) if p.exists())
    return convert(program, prefix.with_suffix(".pdiparams"), out / ONNX_FILE)
