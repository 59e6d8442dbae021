"""Exactly-once audit: which record ids entered the final model, and how often.

Each trainer logs, *before* each all-reduce, the record ids of the batch it is
about to contribute, tagged with the generation and step. Whether that step
became part of the final model's lineage is decided afterwards: a later
generation that started from base step ``b`` discards every step above ``b``
of earlier generations (they were lost with a dead replica or rolled back to a
checkpoint). Generations are ordered by (master incarnation, generation id).

The log lives under the job's checkpoint prefix (``edl.storage.audit``), so that it works on a
cluster as it does locally: trainer pods write it, the launcher reads it when the job ends.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from edl.storage.audit import AuditWriter, read_audit_lines
from edl.storage.store import ObjectStore


class AuditLog:
    """One trainer's log, in ``store`` (the job's checkpoint store); each record is durable once written."""

    def __init__(self, store: ObjectStore, trainer_id: str) -> None:
        self._out = AuditWriter(store, trainer_id)

    def generation(self, key: tuple[int, int], base_step: int) -> None:
        self._out.write(json.dumps({"gen": list(key), "base": base_step}))

    def step(self, key: tuple[int, int], step: int, records: dict[int, list[int]]) -> None:
        self._out.write(json.dumps({"gen": list(key), "step": step,
                                    "records": {str(e): ids for e, ids in records.items()}}))

    def close(self) -> None:
        pass  # nothing buffered


@dataclass(frozen=True)
class AuditResult:
    counts: dict[int, Counter]  # epoch -> record id -> times its gradient entered the model
    lost: int
    duplicates: int
    samples_per_epoch: list[int]


def audit(store: ObjectStore, expected_ids: list[int], epochs: int) -> AuditResult:
    """Every trainer's log in ``store`` (the job's checkpoint store) against the data set's ids."""
    return audit_lines(read_audit_lines(store), expected_ids, epochs)


def audit_lines(lines: Iterable[str], expected_ids: list[int], epochs: int) -> AuditResult:
    bases: dict[tuple[int, int], int] = {}
    steps: list[tuple[tuple[int, int], int, dict[str, list[int]]]] = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # not a record (a write cut short cannot leave one: each record is one object)
        key = (int(rec["gen"][0]), int(rec["gen"][1]))
        if "base" in rec:
            bases[key] = int(rec["base"])
        else:
            steps.append((key, int(rec["step"]), rec["records"]))
    # ceiling[g] = the smallest base step of any later generation.
    ordered = sorted(bases)
    ceiling: dict[tuple[int, int], float] = {}
    running = float("inf")
    for key in reversed(ordered):
        ceiling[key] = running
        running = min(running, bases[key])
    counts: dict[int, Counter] = {e: Counter() for e in range(epochs)}
    for key, step, records in steps:
        if key not in ceiling or step > ceiling[key]:
            continue
        for e, ids in records.items():
            counts.setdefault(int(e), Counter()).update(ids)
    lost = dup = 0
    expected = set(expected_ids)
    for e in range(epochs):
        c = counts.get(e, Counter())
        lost += sum(1 for i in expected if c.get(i, 0) == 0)
        dup += sum(n - 1 for i, n in c.items() if n > 1)
        dup += sum(n for i, n in c.items() if i not in expected)
    return AuditResult(counts, lost, dup, [sum(counts.get(e, Counter()).values()) for e in range(epochs)])
