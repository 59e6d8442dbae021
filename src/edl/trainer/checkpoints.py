"""Rank 0's checkpoints: a snapshot at a step, cut with the master, written on the writer thread.

A checkpoint holds the model (``model.npz``), the optimizer (``optimizer.npz``), the
trainer's scalars (``trainer.json``) and the master's half of the cut at the same step
(``master.json``: its queue); ``edl.storage.checkpoint`` commits it with a manifest.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from edl.api.data import Cursor
from edl.api.master import TrainerLink
from edl.errors import StaleError
from edl.storage.checkpoint import AsyncCheckpointWriter, Checkpoint, CheckpointStore, WriteJob, decode_arrays, encode_arrays

log = logging.getLogger("edl.trainer")

Snapshot = tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]  # parameters, optimizer arrays, other state


@dataclass(frozen=True)
class LoadedCheckpoint:
    uri: str
    step: int
    params: dict[str, np.ndarray]
    opt_arrays: dict[str, np.ndarray]
    opt_extra: dict


class Checkpointer:
    """``connect`` opens the link the writer thread cuts and commits through."""

    def __init__(self, ckpts: CheckpointStore, connect: Callable[[], TrainerLink], trainer_id: str, model_def: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ckpts = ckpts
        self.connect = connect
        self.id = trainer_id
        self.model_def = model_def
        self.clock = clock
        self._last = clock()
        self._writer: AsyncCheckpointWriter | None = None
        self._link: TrainerLink | None = None

    def since_last_s(self) -> float:
        """Since the last checkpoint was taken (or since we started)."""
        return self.clock() - self._last

    def save(self, generation: int, step: int, cursors: dict[str, Cursor | None], snapshot: Snapshot,
             wait: bool = False) -> None:
        """Take ``snapshot`` (numpy copies, at ``step``) as a checkpoint: cut, serialise and upload on
        the writer thread; ``wait`` for it to be written."""
        self._last = self.clock()
        if self._writer is None:
            self._writer = AsyncCheckpointWriter(self.ckpts, on_error=lambda m: log.warning("%s", m))
            self._link = self.connect()
        link = self._link
        params, opt_arrays, extra = snapshot
        cut_cursors = dict(cursors)  # as of this step: the dict is read on the writer thread

        def build() -> dict[str, bytes]:
            try:
                cut = link.checkpoint_cut(generation, step, cut_cursors)
            except StaleError:
                raise StaleError("generation changed before the checkpoint was cut; skipped") from None
            trainer_meta = {"step": step, "opt_extra": extra, "model_def": self.model_def}
            return {
                "model.npz": encode_arrays(params),
                "optimizer.npz": encode_arrays(opt_arrays),
                "trainer.json": json.dumps(trainer_meta, default=str).encode(),
                "master.json": json.dumps(cut).encode(),
            }

        def on_commit(ckpt: Checkpoint, seconds: float) -> None:
            link.checkpoint_committed(generation, step, ckpt.uri, seconds)
            log.info("trainer %s: checkpoint at step %d committed in %.2f s", self.id, step, seconds)

        self._writer.submit(WriteJob(step, build, {"generation": generation}, on_commit))
        if wait:
            self._writer.flush(300)

    def flush(self, timeout_s: float) -> None:
        """Let a checkpoint being written finish (within ``timeout_s``)."""
        if self._writer is not None:
            self._writer.flush(timeout_s)

    def read(self, uri: str) -> LoadedCheckpoint:
        """The committed checkpoint at ``uri``, verified."""
        ckpt, files = self.ckpts.read(uri.rstrip("/").rsplit("/", 1)[-1])
        meta = json.loads(files["trainer.json"])
        return LoadedCheckpoint(ckpt.uri, ckpt.step, decode_arrays(files["model.npz"]),
                                decode_arrays(files["optimizer.npz"]), meta["opt_extra"])
