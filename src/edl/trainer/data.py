"""The trainer's local view of its tasks: what it holds, how far it is, the next batch."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pyarrow as pa

from edl.data.dataset import Dataset
from edl.api.data import Cursor, Task


@dataclass
class Slice:
    task: Task
    start: int  # absolute row in the shard
    end: int


class TaskBuffer:
    """Held tasks in order, with rows consumed of the first. Thread-safe appends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tasks: list[Task] = []
        self.offset = 0  # rows consumed of tasks[0]
        self.cursor: Cursor | None = None  # position after the last taken batch

    def add(self, task: Task) -> bool:
        """Hold ``task`` unless it is held already; whether it was new."""
        with self._lock:
            if any(t.id == task.id for t in self.tasks):
                return False
            self.tasks.append(task)
            return True

    def remaining(self) -> int:
        with self._lock:
            return sum(t.size for t in self.tasks) - self.offset

    def take(self, n: int) -> list[Slice]:
        """Take up to ``n`` rows, crossing task boundaries; fully consumed tasks are dropped."""
        out: list[Slice] = []
        with self._lock:
            while n > 0 and self.tasks:
                t = self.tasks[0]
                lo = t.start + self.offset
                k = min(n, t.end - lo)
                out.append(Slice(t, lo, lo + k))
                n -= k
                self.offset += k
                self.cursor = Cursor(t.id, self.offset)
                if self.offset >= t.size:
                    self.tasks.pop(0)
                    self.offset = 0
        return out

    def reposition(self, cursor: Cursor | None, held: list[Task], offset: int) -> None:
        """Adopt the master's view at a generation start: ``held`` with ``offset`` rows of the first consumed."""
        with self._lock:
            self.tasks = list(held)
            self.offset = offset if self.tasks else 0
            self.cursor = cursor

    def clear(self) -> None:
        with self._lock:
            self.tasks, self.offset, self.cursor = [], 0, None


def read_slices(dataset: Dataset, slices: list[Slice]) -> pa.Table:
    """The rows of (at least one) ``slices``, in order."""
    parts = [dataset.rows(s.task.shard, s.start, s.end) for s in slices]
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def record_ids(dataset: Dataset, slices: list[Slice]) -> dict[int, list[int]]:
    """The record ids in ``slices``, by epoch (what the exactly-once audit logs)."""
    ids: dict[int, list[int]] = {}
    for s in slices:
        ids.setdefault(s.task.epoch, []).extend(dataset.rows(s.task.shard, s.start, s.end).column("id").to_pylist())
    return ids
