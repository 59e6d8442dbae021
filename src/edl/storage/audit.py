"""Where the exactly-once audit log lives: under the job's checkpoint prefix, in its store.

The trainers (processes or pods) write it and the launcher reads it when the job ends, so it works
wherever the checkpoints do (a directory locally, S3/MinIO on a cluster). An object store has no
append: each record is one object, written before the step it describes is all-reduced, so a
trainer killed right after loses nothing the model saw. Keys: ``audit/WRITER/NONCE-SEQ.jsonl``
(``NONCE``: one per writer process, so that a writer's name used twice never overwrites a record).
It costs one write per trainer and step: the audit is for tests and investigations, not for speed.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from edl.storage.store import ObjectStore

AUDIT_PREFIX = "audit/"
_READERS = 8  # parallel gets: an S3 round trip per record


class AuditWriter:
    """One writer's records (a JSON line each), in the order written."""

    def __init__(self, store: ObjectStore, writer: str) -> None:
        self.store = store
        self.prefix = f"{AUDIT_PREFIX}{writer}/{os.getpid()}{secrets.token_hex(4)}-"
        self.seq = 0

    def write(self, line: str) -> None:
        self.store.put(f"{self.prefix}{self.seq:09d}.jsonl", (line.rstrip("\n") + "\n").encode())
        self.seq += 1


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
