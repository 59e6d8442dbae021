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
from edl.errors import StaleError, TemporaryError
from edl.storage.checkpoint import (AsyncCheckpointWriter, Checkpoint, CheckpointStore, WriteJob, decode_arrays,
                                    encode_arrays, name_of)

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

    def save(self, generation: int, step: int, cursors: dict[str, Cursor | None],
             snapshot: Callable[[], Snapshot], cut_link: TrainerLink, wait: bool = False) -> bool:
        """A checkpoint at ``step``: the master's half of the cut through ``cut_link``, here, then the
        ``snapshot`` (numpy copies) serialised and uploaded on the writer thread; ``wait`` for it to be
        written. ``False``: no checkpoint this time (the generation changed, or the master is away).

        The cut is taken on the caller's thread, before its next step: no rank commits a cursor past
        ``cursors`` until every rank has finished that next step, so the master cuts its queue as it
        was at ``step``. Cut on the writer thread, it raced the other ranks' commits: a task one of
        them finished after ``step`` was already done in the checkpoint's queue, and a job that went
        back to that checkpoint lost its rows."""
        self._last = self.clock()
        try:
            cut = cut_link.checkpoint_cut(generation, step, dict(cursors))
        except StaleError:
            log.info("trainer %s: generation %d changed before the checkpoint at step %d was cut; skipped",
                     self.id, generation, step)
            return False
        except TemporaryError as e:
            log.warning("trainer %s: no checkpoint at step %d: the master did not take the cut (%s)",
                        self.id, step, str(e).splitlines()[0] if str(e) else type(e).__name__)
            return False
        if self._writer is None:
            self._writer = AsyncCheckpointWriter(self.ckpts, on_error=lambda m: log.warning("%s", m))
            self._link = self.connect()
        link = self._link
        assert link is not None  # made with the writer
        params, opt_arrays, extra = snapshot()

        def build() -> dict[str, bytes]:
            trainer_meta = {"step": step, "opt_extra": extra, "model_def": self.model_def}
            return {
                "model.npz": encode_arrays(params),
                "optimizer.npz": encode_arrays(opt_arrays),
                "trainer.json": json.dumps(trainer_meta, default=str).encode(),
                "master.json": json.dumps(cut).encode(),
            }

        def on_commit(ckpt: Checkpoint, seconds: float) -> bool:
            taken = link.checkpoint_committed(generation, step, ckpt.uri, seconds)
            log.info("trainer %s: checkpoint at step %d committed in %.2f s%s", self.id, step, seconds,
                     "" if taken else " (the master no longer holds its cut: older checkpoints kept)")
            return taken

        self._writer.submit(WriteJob(step, build, {"generation": generation}, on_commit))
        if wait:
            self._writer.flush(300)
        return True

    def flush(self, timeout_s: float) -> None:
        """Let a checkpoint being written finish (within ``timeout_s``)."""
        if self._writer is not None:
            self._writer.flush(timeout_s)

    def read(self, uri: str) -> LoadedCheckpoint:
        """The committed checkpoint at ``uri``, verified."""
        ckpt, files = self.ckpts.read(name_of(uri))
        meta = json.loads(files["trainer.json"])
        return LoadedCheckpoint(ckpt.uri, ckpt.step, decode_arrays(files["model.npz"]),
                                decode_arrays(files["optimizer.npz"]), meta["opt_extra"])
