"""Exactly-once audit, the trainer's side: the record ids of each batch, logged before it is all-reduced.

Each trainer logs, *before* each all-reduce, the record ids of the batch it is about to contribute,
tagged with the generation and step, and each generation it joins with its base step. The log lives
under the job's checkpoint prefix, and the verdict on it (which records entered the final model,
and how often) is read there when the job ends: both in ``edl.storage.audit``. A local job's trainers
keep the records their store cannot take at once in the job's directory until it is back, so an S3
outage does not stall an audited job (``AUDIT_SPOOL_ENV``).
"""

from __future__ import annotations

import json
import time
from typing import Callable

from edl.storage.audit import AuditWriter
from edl.storage.store import ObjectStore


class AuditLog:
    """One trainer's log, in ``store`` (the job's checkpoint store); each record is durable once written,
    there or, while the store is away, in ``spool`` (a local job's directory: ``AuditWriter``)."""

    def __init__(self, store: ObjectStore, trainer_id: str, clock: Callable[[], float] = time.time,
                 spool: ObjectStore | None = None) -> None:
        self._out = AuditWriter(store, trainer_id, spool)
        self._clock = clock  # wall clock: when each step was logged, for a soak's account of time

    def generation(self, key: tuple[int, int], base_step: int) -> None:
        self._out.write(json.dumps({"gen": list(key), "base": base_step}))

    def step(self, key: tuple[int, int], step: int, records: dict[int, list[int]]) -> None:
        self._out.write(json.dumps({"gen": list(key), "step": step, "at": round(self._clock(), 4),
                                    "records": {str(e): ids for e, ids in records.items()}}))

    def close(self) -> None:
        self._out.close()  # nothing buffered: every record is in the store or the spool
