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


@dataclass(frozen=True)
class Ledger:
    """Every task taken into the buffer since ``start`` (the cursor where the ledger begins), in
    consumption order, ``offset`` rows of the first consumed before: what a restarted master needs to
    know which rows this trainer consumed since its checkpoint (``edl.master.resume``)."""

    key: tuple[str, int]  # (master uid, generation) the ledger belongs to
    tasks: tuple[Task, ...]
    start: Cursor | None
    offset: int


class TaskBuffer:
    """Held tasks in order, with rows consumed of the first, and the ledger of the tasks taken. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._took = threading.Condition(self._lock)  # notified when rows leave the buffer
        self.tasks: list[Task] = []
        self.offset = 0  # rows consumed of tasks[0]
        self.cursor: Cursor | None = None  # position after the last taken batch
        # The ledger (see ``Ledger``): a list here, as it grows by a task at a time.
        self._key: tuple[str, int] = ("", 0)
        self._taken: list[Task] = []
        self._start: Cursor | None = None
        self._start_offset = 0
        # Bumped whenever the held tasks are replaced (``clear``, ``reposition``), not when a generation goes
        # on with them (``rekey``): an answer to a request made before a bump is not ours to hold.
        self._lineage = 0
        self.rows_taken = 0  # by the loop, ever: how fast it reads (``edl.trainer.prefetch.AskPace``)

    def ticket(self) -> tuple[tuple[str, int], int]:
        """What a request for a task is made under: the (master uid, generation) the buffer holds tasks for,
        and its lineage (``add``)."""
        with self._lock:
            return self._key, self._lineage

    def add(self, task: Task, lineage: int | None = None) -> bool:
        """Hold ``task`` unless it is held already, or it answers a request made under another ``lineage``
        (the buffer was cleared or replaced while the request was on the wire: the master counts the task
        in what it told us at the change, or took it back with the rest); whether it was new."""
        with self._lock:
            if lineage is not None and lineage != self._lineage:
                return False
            if any(t.id == task.id for t in self.tasks):
                return False
            self.tasks.append(task)
            self._taken.append(task)
            return True

    def remaining(self) -> int:
        with self._lock:
            return self._remaining()

    def _remaining(self) -> int:
        return sum(t.size for t in self.tasks) - self.offset

    def wait_below(self, rows: int, timeout_s: float) -> bool:
        """Until fewer than ``rows`` rows are held (the loop took a batch, the buffer was cleared), or
        ``timeout_s`` has passed; whether fewer are held."""
        with self._took:
            return self._took.wait_for(lambda: self._remaining() < rows, timeout_s)

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
            self.rows_taken += sum(s.end - s.start for s in out)
            self._took.notify_all()
        return out

    def reposition(self, cursor: Cursor | None, held: list[Task], offset: int, key: tuple[str, int] = ("", 0)) -> None:
        """Adopt the master's view at the start of generation ``key``: ``held`` with ``offset`` rows of the
        first consumed; the ledger starts there."""
        with self._lock:
            self.tasks = list(held)
            self.offset = offset if self.tasks else 0
            self.cursor = cursor
            self._key, self._taken, self._start, self._start_offset = key, list(held), cursor, self.offset
            self._lineage += 1
            self._took.notify_all()

    def rekey(self, key: tuple[str, int]) -> None:
        """Generation ``key`` goes on from here with what is held (a switch at a step boundary): the ledger
        starts at the current position."""
        with self._lock:
            self._key, self._taken, self._start, self._start_offset = key, list(self.tasks), self.cursor, self.offset

    def clear(self, key: tuple[str, int] = ("", 0)) -> None:
        """Hold nothing: generation ``key`` starts from the master's queue; so does the ledger."""
        with self._lock:
            self.tasks, self.offset, self.cursor = [], 0, None
            self._key, self._taken, self._start, self._start_offset = key, [], None, 0
            self._lineage += 1
            self._took.notify_all()

    def ledger(self) -> Ledger:
        with self._lock:
            return Ledger(self._key, tuple(self._taken), self._start, self._start_offset)

    def forget_before(self, key: tuple[str, int], cursor: Cursor | None) -> None:
        """A checkpoint of generation ``key`` committed with this trainer at ``cursor``: the ledger need
        not reach back further (a restarted master walks it from there)."""
        with self._lock:
            if cursor is None or key != self._key or cursor == self._start:
                return
            for i, t in enumerate(self._taken):
                if t.id == cursor.task_id:
                    del self._taken[:i]
                    self._start, self._start_offset = cursor, cursor.offset
                    return


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
