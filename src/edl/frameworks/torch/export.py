"""A PyTorch model out of the trainer: ``torch.export``'s program (``model.pt2``) and the same as ONNX.

The ONNX model comes from ``torch.onnx``'s TorchScript exporter (``dynamo=False``): it needs
nothing beyond torch (the dynamo exporter would need onnxscript), and ONNX's checker
validates what it writes. Both exports take any batch size; a model that either cannot
export keeps the other (and ``params.npz``), and the log says why in one line.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edl.storage.checkpoint import ONNX_FILE

log = logging.getLogger("edl.trainer")

PROGRAM_FILE = "model.pt2"
OPSET = 17


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


@contextmanager
def _stdout_dropped() -> Iterator[None]:
    """File descriptor 1 into a scratch file for the duration: the TorchScript exporter prints the whole
    graph to it from C++ when it meets an operator it cannot convert (our one log line says why)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


def tensor_of(a: Any) -> torch.Tensor:
    """An array as a tensor, shared where it can be. An array read-only in numpy (Arrow's buffers, zero-copy)
    is copied: torch cannot mark a tensor read-only and warns on every process's first such batch."""
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        a = a.copy()
    return torch.as_tensor(a)


def tensors_of(x: Any) -> tuple[torch.Tensor, ...]:
    """The model's inputs: ``collate`` may give one array or a tuple of them."""
    return tuple(tensor_of(a) for a in x) if isinstance(x, tuple) else (tensor_of(x),)


def export_inference(model: torch.nn.Module, sample_input: Any, out: Path) -> str | None:
    """Write ``model.pt2`` and ``model.onnx`` into ``out``; answers why there is no ONNX model, or
    ``None``. ``sample_input``: a batch of two rows (the batch dimension stays dynamic)."""
    inputs = tensors_of(sample_input)
    names = ["x"] if len(inputs) == 1 else [f"x{i}" for i in range(len(inputs))]
    model.eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporters' deprecation and tracing notes
            try:
                batch = torch.export.Dim("batch")
                program = torch.export.export(model, inputs, dynamic_shapes=tuple({0: batch} for _ in inputs))
                torch.export.save(program, str(out / PROGRAM_FILE))
            except Exception as e:  # noqa: BLE001 - the exporter raises whatever the model's code does
                log.warning("no %s export (params.npz stands): %s", PROGRAM_FILE, _why(e))
            try:
                with _stdout_dropped():
                    torch.onnx.export(model, inputs, str(out / ONNX_FILE), dynamo=False, input_names=names,
                                      output_names=["y"], opset_version=OPSET,
                                      dynamic_axes={**{n: {0: "batch"} for n in names}, "y": {0: "batch"}})
                import onnx

                onnx.checker.check_model(onnx.load(str(out / ONNX_FILE)), full_check=True)
            except Exception as e:  # noqa: BLE001
                (out / ONNX_FILE).unlink(missing_ok=True)
                return f"torch.onnx could not convert the model: {_why(e)}"
    finally:
        model.train()
    return None
