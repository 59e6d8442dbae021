"""The exactly-once audit log: where it lives, and its verdict (which record ids entered the final model).

The log lives under the job's checkpoint prefix, in its store. The trainers (processes or pods)
write it and the launcher reads it when the job ends, so it works wherever the checkpoints do (a
directory locally, S3/MinIO on a cluster). An object store has no append: each record is one
object, written before the step it describes is all-reduced, so a trainer killed right after loses
nothing the model saw. Keys: ``audit/WRITER/NONCE-SEQ.jsonl`` (``NONCE``: one per writer process, so
that a writer's name used twice never overwrites a record). It costs one write per trainer and
step: the audit is for tests and investigations, not for speed.

Each trainer logs (``edl.trainer.audit``), before each all-reduce, the record ids of the batch it is
about to contribute, tagged with the generation and step. Whether that step became part of the
final model's lineage is decided afterwards (``audit``): a later generation that started from base
step ``b`` discards every step above ``b`` of earlier generations (they were lost with a dead
replica or rolled back to a checkpoint). Generations are ordered by (master incarnation, generation id).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from edl.errors import StorageError
from edl.storage.store import FileStore, ObjectStore

log = logging.getLogger("edl.audit")
AUDIT_PREFIX = "audit/"
# A local job's directory for the records its trainers' store cannot take at once (``AuditWriter``).
AUDIT_SPOOL_ENV = "EDL_AUDIT_SPOOL"
SPOOL_UPLOAD_EVERY_S = 0.5  # how often a writer with records in its spool tries the store again
_READERS = 8  # parallel gets: an S3 round trip per record


class AuditWriter:
    """One writer's records (a JSON line each), in the order written.

    With a ``spool`` (``audit_spool``: a local job's directory, which outlives the writer), a record the
    store cannot take at once goes there instead, and so does every record after it until a thread has
    moved them all to the store: the writer never waits out an outage of the store, and a record in the
    spool is as durable as one in the store (``upload_spool`` moves what a killed writer left). Without
    one, each write waits until the store takes it (a pod's disk goes with the pod)."""

    def __init__(self, store: ObjectStore, writer: str, spool: ObjectStore | None = None,
                 every_s: float = SPOOL_UPLOAD_EVERY_S) -> None:
        self.store = store
        self.spool = spool
        self.prefix = f"{AUDIT_PREFIX}{writer}/{os.getpid()}{secrets.token_hex(4)}-"
        self.seq = 0
        self._lock = threading.Lock()
        self._behind = False  # records wait in the spool: the next ones go there too, in order
        self._wake = threading.Event()
        self._closed = threading.Event()
        if spool is not None:
            threading.Thread(target=self._upload_loop, args=(every_s,), name="edl-audit-spool", daemon=True).start()

    def write(self, line: str) -> None:
        key, data = f"{self.prefix}{self.seq:09d}.jsonl", (line.rstrip("\n") + "\n").encode()
        self.seq += 1
        if self.spool is None:
            self.store.put(key, data)
            return
        with self._lock:
            if not self._behind:
                try:
                    self.store.put_once(key, data)
                    return
                except StorageError as e:
                    log.warning("audit: %s; records wait in %s until it answers", e, self.spool.uri)
                    self._behind = True
            self.spool.put(key, data)
        self._wake.set()

    @property
    def behind(self) -> bool:
        return self._behind

    def close(self) -> None:
        """Stop moving records: what is in the spool stays there (``upload_spool`` moves it later)."""
        self._closed.set()
        self._wake.set()

    def _upload_loop(self, every_s: float) -> None:
        assert self.spool is not None
        failure = ""
        while not self._closed.is_set():
            self._wake.wait(every_s)
            self._wake.clear()
            if not self._behind or self._closed.is_set():
                continue
            try:
                upload_spool(self.store, self.spool, mine=self.prefix, once=True)
            except Exception as e:  # noqa: BLE001 - still away (or refusing): the records stay; the loop goes on
                if not isinstance(e, StorageError) and str(e) != failure:
                    log.warning("audit: cannot move the spooled records to the store: %s", e)
                failure = str(e)
                continue
            with self._lock:  # nothing spooled since the last listing: back to writing to the store
                if not self.spool.list(self.prefix):
                    self._behind = False
                    failure = ""
                    log.info("audit: the store answers again; the spooled records are in it")


def audit_spool(directory: Path) -> ObjectStore:
    """The spool of a local job's trainers in ``directory``: several processes write and delete there at once."""
    return FileStore(directory.as_uri(), directory, prune=False)


def upload_spool(store: ObjectStore, spool: ObjectStore, mine: str = AUDIT_PREFIX, once: bool = False) -> int:
    """Move the records in ``spool`` under ``mine`` to ``store`` (each written there, then removed from the
    spool: a move cut short leaves a record in both, the same key, read once). ``once``: one attempt per
    record (the caller tries again later). How many it moved."""
    moved = 0
    for key in spool.list(mine):
        try:
            data = spool.get(key)
        except StorageError:
            continue  # moved by another (a writer and a launcher both at it)
        (store.put_once if once else store.put)(key, data)
        spool.delete([key])
        moved += 1
    return moved


def audit_keys(store: ObjectStore) -> list[str]:
    return [k for k in store.list(AUDIT_PREFIX) if k.endswith(".jsonl")]


def read_audit_lines(store: ObjectStore) -> Iterator[str]:
    """Every line every writer wrote (writers in key order, each writer's in its order)."""
    keys = audit_keys(store)
    with ThreadPoolExecutor(_READERS) as pool:
        for data in pool.map(store.get, keys):
            yield from data.decode().splitlines()


def clear_audit(store: ObjectStore) -> None:
    """A job that starts from scratch (no checkpoint): records of an earlier start are not its own."""
    keys = audit_keys(store)
    if keys:
        store.delete(keys)


@dataclass(frozen=True)
class AuditResult:
    counts: dict[int, Counter]  # epoch -> record id -> times its gradient entered the model
    lost: int
    duplicates: int
    samples_per_epoch: list[int]


def audit(store: ObjectStore, expected_ids: list[int], epochs: int) -> AuditResult:
    """Every trainer's log in ``store`` (the job's checkpoint store) against the data set's ids."""
    return audit_lines(read_audit_lines(store), expected_ids, epochs)


@dataclass(frozen=True)
class KeptStep:
    """One trainer's record of a step that entered the final model: its generation's key, the step, the
    record ids per epoch, and when the trainer logged it (wall-clock seconds; None in older logs)."""

    key: tuple[int, int]
    step: int
    records: dict[str, list[int]]
    at: float | None


def kept_steps(lines: Iterable[str]) -> list[KeptStep]:
    """The records of the final model's lineage: a later generation that started from base step ``b``
    discards every step above ``b`` of earlier generations."""
    bases: dict[tuple[int, int], int] = {}
    steps: list[KeptStep] = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # not a record (a write cut short cannot leave one: each record is one object)
        key = (int(rec["gen"][0]), int(rec["gen"][1]))
        if "base" in rec:
            bases[key] = int(rec["base"])
        else:
            steps.append(KeptStep(key, int(rec["step"]), rec["records"], rec.get("at")))
    # ceiling[g] = the smallest base step of any later generation.
    ceiling: dict[tuple[int, int], float] = {}
    running = float("inf")
    for key in sorted(bases, reverse=True):
        ceiling[key] = running
        running = min(running, bases[key])
    return [s for s in steps if s.key in ceiling and s.step <= ceiling[s.key]]


def audit_lines(lines: Iterable[str], expected_ids: list[int], epochs: int) -> AuditResult:
    counts: dict[int, Counter] = {e: Counter() for e in range(epochs)}
    for s in kept_steps(lines):
        for e, ids in s.records.items():
            counts.setdefault(int(e), Counter()).update(ids)
    lost = dup = 0
    expected = set(expected_ids)
    for epoch in range(epochs):
        c = counts.get(epoch, Counter())
        lost += sum(1 for i in expected if c.get(i, 0) == 0)
        dup += sum(n - 1 for i, n in c.items() if n > 1)
        dup += sum(n for i, n in c.items() if i not in expected)
    return AuditResult(counts, lost, dup, [sum(counts.get(e, Counter()).values()) for e in range(epochs)])
