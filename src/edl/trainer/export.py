"""A trained model out of the trainer: its exported directory and its held-out evaluation.

The exported model directory (``CHECKPOINT_URI/model``, the pipeline's Model artifact,
a registry's ``current/``) holds the inference model written by ``paddle.jit.save``
(``inference.json``, ``inference.pdiparams``), the same model as ONNX (``model.onnx``, for
ONNX Runtime, Triton and KServe; left out, with one log line, for a model whose operators
paddle2onnx cannot convert) and ``params.npz``, the parameters by structured name that a
later run warm-starts from (``--init-model``) and the pipeline evaluates. The trainer writes it at the end of a job;
the pipeline's steps read it.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paddle
import pyarrow as pa

from edl.errors import EdlError, UserError
from edl.modeldef import ModelDef
from edl.storage.checkpoint import ONNX_FILE, WARM_START_FILE, decode_arrays, encode_arrays
from edl.storage.store import ObjectStore, open_store
from edl.trainer.onnx_export import convert
from edl.trainer.state import parameters

log = logging.getLogger("edl.trainer")

MODEL_DIR = "model"  # under the checkpoint URI
EVAL_BATCH = 1024  # rows per forward pass when evaluating


def export_model(model: paddle.nn.Layer, sample_input: np.ndarray, store: ObjectStore) -> str:
    """Write ``model`` into ``store``'s model directory; answers its URI. ``sample_input``: a batch
    of one, for the inference model's input spec (any batch size)."""
    from paddle.static import InputSpec

    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "inference"
        model.eval()
        spec = [InputSpec([None, *sample_input.shape[1:]], str(sample_input.dtype), "x")]
        paddle.jit.save(model, str(prefix), input_spec=spec)
        model.train()
        program = next(p for p in (prefix.with_suffix(".json"), prefix.with_suffix(".pdmodel")) if p.exists())
        why_not = convert(program, prefix.with_suffix(".pdiparams"), Path(tmp) / ONNX_FILE)
        if why_not is not None:
            log.warning("no ONNX export (the Paddle export stands): %s", why_not)
        for f in sorted(Path(tmp).iterdir()):
            store.put(f"{MODEL_DIR}/{f.name}", f.read_bytes())
    store.put(f"{MODEL_DIR}/{WARM_START_FILE}", encode_arrays(parameters(model)))
    return store.child(MODEL_DIR)


def read_warm_start(uri: str) -> dict[str, np.ndarray]:
    """The parameters of the model exported at ``uri`` (``--init-model``)."""
    try:
        return decode_arrays(open_store(uri, "--init-model").get(WARM_START_FILE))
    except (OSError, ValueError, EdlError) as e:
        raise UserError(f"--init-model {uri!r}: cannot read {WARM_START_FILE}: {e}") from None


@dataclass(frozen=True)
class Evaluation:
    loss: float  # the model definition's loss over every row
    metrics: dict[str, float]  # its metrics(); by default the loss and, for class scores, the accuracy
    # For class scores and integer labels: confusion[true][predicted] counts (the KFP UI's matrix).
    confusion: list[list[int]] | None = None


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray, classes: int) -> list[list[int]]:
    """At least ``classes`` x ``classes`` counts (more if a label is beyond the model's classes): row the
    true class, column the predicted one."""
    classes = max(classes, int(labels.max()) + 1 if labels.size else 0)
    counts = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(counts, (labels.astype(np.int64), predicted.astype(np.int64)), 1)
    return counts.tolist()


def evaluate(md: ModelDef, model: paddle.nn.Layer, table: pa.Table) -> Evaluation:
    """``model`` on every row of ``table`` (in eval mode, no gradients)."""
    x, y = md.collate(table)
    model.eval()
    with paddle.no_grad():
        out = paddle.concat([md.forward(model, paddle.to_tensor(x[i : i + EVAL_BATCH]))
                             for i in range(0, len(x), EVAL_BATCH)])
        loss = float(md.loss(out, paddle.to_tensor(y)))
    model.train()
    scores = out.numpy()
    classified = scores.ndim == 2 and y.ndim == 1 and np.issubdtype(y.dtype, np.integer)
    confusion = confusion_matrix(y, scores.argmax(axis=1), scores.shape[1]) if classified else None
    if md.metrics is not None:
        return Evaluation(loss, {k: float(v) for k, v in md.metrics(scores, y).items()}, confusion)
    metrics = {"loss": loss}
    if classified:
        metrics["accuracy"] = float((scores.argmax(axis=1) == y).mean())
    return Evaluation(loss, metrics, confusion)
