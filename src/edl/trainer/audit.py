"""Exactly-once audit: which record ids entered the final model, and how often.

Each trainer logs, *before* each all-reduce, the record ids of the batch it is
about to contribute, tagged with the generation and step. Whether that step
became part of the final model's lineage is decided afterwards: a later
generation that started from base step ``b`` discards every step above ``b``
of earlier generations (they were lost with a dead replica or rolled back to a
checkpoint). Generations are ordered by (master incarnation, generation id).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO


class AuditLog:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] = path.open("a", buffering=1)  # line-buffered: survives SIGKILL of the writer

    def generation(self, key: tuple[int, int], base_step: int) -> None:
        self._f.write(json.dumps({"gen": list(key), "base": base_step}) + "\n")

    def step(self, key: tuple[int, int], step: int, records: dict[int, list[int]]) -> None:
        self._f.write(json.dumps({"gen": list(key), "step": step, "records": {str(e): ids for e, ids in records.items()}}) + "\n")

    def close(self) -> None:
        self._f.close()


@dataclass(frozen=True)
class AuditResult:
    counts: dict[int, Counter]  # epoch -> record id -> times its gradient entered the model
    lost: int
    duplicates: int
    samples_per_epoch: list[int]


def audit(audit_dir: Path, expected_ids: list[int], epochs: int) -> AuditResult:
    bases: dict[tuple[int, int], int] = {}
    steps: list[tuple[tuple[int, int], int, dict[str, list[int]]]] = []
    for path in sorted(audit_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by SIGKILL
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
