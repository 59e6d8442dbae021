"""A trained model out of the trainer: its exported directory and its held-out evaluation.

The exported model directory (``CHECKPOINT_URI/model``, the pipeline's Model artifact,
a registry's ``current/``) holds the framework's own inference model (PaddlePaddle's
``paddle.jit.save`` files, or PyTorch's ``model.pt2`` from ``torch.export``), the same model
as ONNX (``model.onnx``, for ONNX Runtime, Triton and KServe; left out, with one log line, for a
model whose operators the converter cannot take) and ``params.npz``, the parameters by
structured name that a later run warm-starts from (``--init-model``) and the pipeline
evaluates. The trainer writes it at the end of a job; the pipeline's steps read it.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

from edl.api.framework import Evaluation, Replica
from edl.errors import EdlError, UserError
from edl.modeldef import ModelDef
from edl.storage.checkpoint import WARM_START_FILE, decode_arrays, encode_arrays
from edl.storage.store import ObjectStore, open_store

log = logging.getLogger("edl.trainer")

MODEL_DIR = "model"  # under the checkpoint URI


def export_model(replica: Replica, store: ObjectStore) -> str:
    """Write ``replica``'s model into ``store``'s model directory; answers its URI."""
    with tempfile.TemporaryDirectory() as tmp:
        why_not = replica.export(Path(tmp))
        if why_not is not None:
            log.warning("no ONNX export (the framework's own export stands): %s", why_not)
        for f in sorted(Path(tmp).iterdir()):
            store.put(f"{MODEL_DIR}/{f.name}", f.read_bytes())
    store.put(f"{MODEL_DIR}/{WARM_START_FILE}", encode_arrays(replica.parameters()))
    return store.child(MODEL_DIR)


def read_warm_start(uri: str) -> dict[str, np.ndarray]:
    """The parameters of the model exported at ``uri`` (``--init-model``)."""
    try:
        return decode_arrays(open_store(uri, "--init-model").get(WARM_START_FILE))
    except (OSError, ValueError, EdlError) as e:
        raise UserError(f"--init-model {uri!r}: cannot read {WARM_START_FILE}: {e}") from None


def confusion_matrix(labels: np.ndarray, predicted: np.ndarray, classes: int) -> list[list[int]]:
    """At least ``classes`` x ``classes`` counts (more if a label is beyond the model's classes): row the
    true class, column the predicted one."""
    classes = max(classes, int(labels.max()) + 1 if labels.size else 0)
    counts = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(counts, (labels.astype(np.int64), predicted.astype(np.int64)), 1)
    return counts.tolist()


def evaluate(md: ModelDef, replica: Replica, table: pa.Table) -> Evaluation:
    """``replica``'s model on every row of ``table`` (in eval mode, no gradients)."""
    x, y = md.collate(table)
    loss, scores = replica.evaluate(x, y)
    classified = scores.ndim == 2 and y.ndim == 1 and np.issubdtype(y.dtype, np.integer)
    confusion = confusion_matrix(y, scores.argmax(axis=1), scores.shape[1]) if classified else None
    if md.metrics is not None:
        return Evaluation(loss, {k: float(v) for k, v in md.metrics(scores, y).items()}, confusion)
    metrics = {"loss": loss}
    if classified:
        metrics["accuracy"] = float((scores.argmax(axis=1) == y).mean())
    return Evaluation(loss, metrics, confusion)
