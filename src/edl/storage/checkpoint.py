"""Checkpoints as consistent cuts: files first, a manifest with checksums last.

Layout under the checkpoint URI::

    ckpt-000000000120/model.npz        model parameters (numpy, no pickle)
    ckpt-000000000120/optimizer.npz    optimizer accumulators
    ckpt-000000000120/trainer.json     step, layouts, non-tensor optimizer state
    ckpt-000000000120/master.json      the master's queue cut at the same step
    ckpt-000000000120/MANIFEST.json    written last: the commit point
    model/                             the final inference model (paddle.jit.save)
    final.json                         the finished job's outcome (written after model/)

A directory without a manifest is an uncommitted write and is never read; one
whose checksums do not match is skipped with a warning. The newest valid one
wins. Writes go through a background thread so that training does not wait,
and storage outages are retried there while training goes on.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edl.errors import EdlError, StorageError
from edl.storage.store import ObjectStore

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("edl.checkpoint")

PREFIX = "ckpt-"
MANIFEST = "MANIFEST.json"
WARM_START_FILE = "params.npz"  # in an exported model directory: parameters by structured name
ONNX_FILE = "model.onnx"  # in an exported model directory: the model as ONNX (edl serve, ONNX Runtime, KServe)
FINAL = "final.json"  # outcome of a finished job: step, final model URI, held-out metrics
FORMAT = 1


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:012d}"


def name_of(uri: str) -> str:
    """A checkpoint's name (``ckpt-...``) from its URI (``Checkpoint.uri``)."""
    return uri.rstrip("/").rsplit("/", 1)[-1]


def encode_arrays(arrays: dict[str, np.ndarray]) -> bytes:
    import numpy as np  # here: a master reads checkpoints' master.json only, and need not import numpy

    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub: ** might name allow_pickle
    return buf.getvalue()


def decode_arrays(data: bytes) -> dict[str, np.ndarray]:
    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    name: str
    step: int
    uri: str
    manifest: dict


class CorruptCheckpoint(EdlError):
    pass


class CheckpointStore:
    def __init__(self, store: ObjectStore, keep: int = 3) -> None:
        self.store = store
        self.keep = keep

    # ------------------------------------------------------------------ write
    def write(self, step: int, files: dict[str, bytes], meta: dict | None = None, prune: bool = True) -> Checkpoint:
        """Commit a checkpoint at ``step``; ``prune``: then drop older ones (``AsyncCheckpointWriter`` prunes
        only once the master took the commit)."""
        name = checkpoint_name(step)
        for fname, data in files.items():
            self.store.put(f"{name}/{fname}", data)
        manifest = {
            "format": FORMAT,
            "step": step,
            "created_at": time.time(),
            "files": {f: {"sha256": sha256(d), "bytes": len(d)} for f, d in files.items()},
            "meta": meta or {},
        }
        self.store.put(f"{name}/{MANIFEST}", json.dumps(manifest, indent=1).encode())
        if prune:
            self.prune()
        return Checkpoint(name, step, self.store.child(name), manifest)

    def prune(self) -> None:
        """Keep the newest ``keep`` committed checkpoints; drop older and abandoned writes."""
        names = self._names()
        committed = [n for n in names if self.store.exists(f"{n}/{MANIFEST}")]
        keep = set(committed[-self.keep :])
        newest = committed[-1] if committed else None
        for n in names:
            if n in keep:
                continue
            if n not in committed and newest is not None and n > newest:
                continue  # a write in progress, newer than anything committed
            keys = self.store.list(f"{n}/")
            # Manifest first: a half-deleted checkpoint must not look committed.
            keys.sort(key=lambda k: 0 if k.endswith(MANIFEST) else 1)
            self.store.delete(keys)

    # ------------------------------------------------------------------- read
    def _names(self) -> list[str]:
        # Only the checkpoints' keys: the audit log beside them holds an object per trainer step.
        names = {k.split("/", 1)[0] for k in self.store.list(PREFIX)}
        return sorted(names)

    def committed(self) -> list[str]:
        return [n for n in self._names() if self.store.exists(f"{n}/{MANIFEST}")]

    def read(self, name: str) -> tuple[Checkpoint, dict[str, bytes]]:
        """Read and verify a checkpoint; ``CorruptCheckpoint`` if anything does not match."""
        try:
            manifest = json.loads(self.store.get(f"{name}/{MANIFEST}"))
        except (StorageError, ValueError) as e:
            raise CorruptCheckpoint(f"{self.store.child(name)}: unreadable manifest ({e})") from e
        if manifest.get("format") != FORMAT:
            raise CorruptCheckpoint(f"{self.store.child(name)}: unknown format {manifest.get('format')!r}")
        files: dict[str, bytes] = {}
        for fname, info in manifest["files"].items():
            try:
                data = self.store.get(f"{name}/{fname}")
            except StorageError as e:
                raise CorruptCheckpoint(f"{self.store.child(name)}: {fname} is missing") from e
            if sha256(data) != info["sha256"]:
                raise CorruptCheckpoint(f"{self.store.child(name)}: {fname} checksum mismatch")
            files[fname] = data
        return Checkpoint(name, int(manifest["step"]), self.store.child(name), manifest), files

    def latest(self, warn: Callable[[str], None] | None = None) -> tuple[Checkpoint, dict[str, bytes]] | None:
        """The newest checkpoint that verifies; corrupt ones are skipped with a warning."""
        for name in reversed(self.committed()):
            try:
                return self.read(name)
            except CorruptCheckpoint as e:
                (warn or log.warning)(f"skipping corrupt checkpoint {e}")
        return None


@dataclass
class WriteJob:
    step: int
    build: Callable[[], dict[str, bytes]]  # serialises the snapshot (runs on the writer thread)
    meta: dict
    # Tells the master; ``True``: it took the commit. Only then are older checkpoints pruned: a rank 0 of a
    # master that was fenced (a lost node's, living on beside its successor) must not delete the
    # checkpoint the successor restored from.
    on_commit: Callable[[Checkpoint, float], bool]
    started: float = 0.0


class AsyncCheckpointWriter:
    """One background thread; a newer snapshot replaces one that has not started yet."""

    def __init__(self, ckpts: CheckpointStore, on_error: Callable[[str], None] | None = None) -> None:
        self.ckpts = ckpts
        self.on_error = on_error or log.warning
        self._q: queue.Queue[WriteJob] = queue.Queue(maxsize=1)
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edl-checkpoint", daemon=True)
        self._thread.start()

    def submit(self, job: WriteJob) -> None:
        job.started = time.monotonic()
        self._busy.set()
        while True:
            try:
                self._q.put_nowait(job)
                return
            except queue.Full:
                try:
                    self._q.get_nowait()  # drop the stale, not yet started snapshot
                except queue.Empty:
                    pass

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    def _run(self) -> None:
        while True:
            job = self._q.get()
            self._busy.set()
            try:
                while True:
                    try:
                        files = job.build()
                        ckpt = self.ckpts.write(job.step, files, job.meta, prune=False)
                        if job.on_commit(ckpt, time.monotonic() - job.started):
                            self._prune()
                        break
                    except StorageError as e:
                        # Storage is down: keep trying while training continues,
                        # unless a newer snapshot is waiting.
                        self.on_error(f"checkpoint at step {job.step} not written yet: {e}; retrying")
                        if not self._q.empty():
                            break
                        time.sleep(1.0)
                    except Exception as e:  # noqa: BLE001 - report, never kill training
                        self.on_error(f"checkpoint at step {job.step} failed: {type(e).__name__}: {e}")
                        break
            finally:
                if self._q.empty():
                    self._busy.clear()

    def _prune(self) -> None:
        try:
            self.ckpts.prune()
        except StorageError as e:  # the next commit prunes what this one left
            self.on_error(f"could not prune old checkpoints: {e}")

    def flush(self, timeout: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout
        while self.busy and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self.busy
