"""Data positions everyone shares: shards, tasks (row ranges of a shard in one epoch) and
the cursor that is a trainer's whole data position, with their one wire form."""

from __future__ import annotations

from dataclasses import dataclass

CursorJSON = list[int] | None


@dataclass(frozen=True)
class Shard:
    """One Parquet file of the data set."""

    name: str
    rows: int


@dataclass(frozen=True)
class Task:
    """Rows ``[start, end)`` of ``shard`` for ``epoch``."""

    id: int
    epoch: int
    shard: str
    start: int
    end: int
    failures: int = 0

    @property
    def size(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        return f"task {self.id} (shard {self.shard} rows {self.start}-{self.end}, epoch {self.epoch})"


@dataclass(frozen=True)
class Cursor:
    """A trainer's data position: ``offset`` rows of task ``task_id`` consumed."""

    task_id: int
    offset: int


def cursor_to_json(c: Cursor | None) -> CursorJSON:
    """The one wire form of a cursor: ``[task_id, offset]``, or ``null`` before any data."""
    return None if c is None else [c.task_id, c.offset]


def cursor_from_json(c: CursorJSON) -> Cursor | None:
    return None if c is None else Cursor(int(c[0]), int(c[1]))
