"""Dynamic data sharding: the task queue of the master, as a pure state machine.

A *task* is a range of rows of one Parquet shard in one epoch. Tasks move
todo -> held (by one trainer, in the order handed out) -> done. A trainer
consumes its held tasks strictly in order, so its whole data position is one
``Cursor`` (task id, rows consumed of that task): every held task before the
cursor's task is fully consumed, every one after is untouched.

Exactly-once rests on that: given a trainer's cursor at a committed step, the
queue can mark what it consumed as done and return exactly the rest, splitting
a partly consumed task into a *remainder* task. No clock is needed here.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from dataclasses import asdict, dataclass, field

from edl.api.data import Cursor, Shard, Task
from edl.api.master import Next
from edl.errors import TaskFailedError


@dataclass
class _Held:
    """Tasks one trainer holds, in the order it consumes them, and its progress."""

    tasks: list[Task] = field(default_factory=list)
    offset: int = 0  # rows consumed of tasks[0]
    last_request: str | None = None
    last_answer: list[Task] = field(default_factory=list)


def _since_progress(task: Task, start: int) -> int:
    """The task's failures that count: none once some of its rows were done since it was handed out (it
    returns from ``start``). A task that fails again and again where it stands is bad data; one whose holders
    keep being preempted part way through is not, however often that happens in a long job."""
    return 0 if start > task.start else task.failures


class TaskQueue:
    """todo / held / done accounting for all epochs of one job."""

    def __init__(
        self,
        shards: list[Shard],
        epochs: int,
        rows_per_task: int,
        max_task_failures: int = 3,
        seed: int = 0,
    ) -> None:
        if rows_per_task <= 0:
            raise ValueError("rows_per_task must be positive")
        self.shards = list(shards)
        self.epochs = epochs
        self.rows_per_task = rows_per_task
        self.max_task_failures = max_task_failures
        self.seed = seed
        self.todo: deque[Task] = deque()
        self.held: dict[str, _Held] = {}
        self.done_rows: dict[int, int] = {e: 0 for e in range(epochs)}
        self.materialized_epochs = 0
        self.next_id = 0

    # ----------------------------------------------------------------- queries
    @property
    def rows_per_epoch(self) -> int:
        return sum(s.rows for s in self.shards)

    def epoch_done(self, epoch: int) -> bool:
        return self.done_rows.get(epoch, 0) >= self.rows_per_epoch

    @property
    def epochs_completed(self) -> int:
        n = 0
        while n < self.epochs and self.epoch_done(n):
            n += 1
        return n

    @property
    def finished(self) -> bool:
        return self.epochs_completed == self.epochs

    @property
    def current_epoch(self) -> int:
        """The oldest epoch that is not done yet (``epochs`` once finished)."""
        return self.epochs_completed

    def held_by(self, trainer: str) -> list[Task]:
        h = self.held.get(trainer)
        return list(h.tasks) if h else []

    # -------------------------------------------------------------- transitions
    def _materialize(self, epoch: int) -> None:
        tasks: list[Task] = []
        for shard in self.shards:
            for start in range(0, shard.rows, self.rows_per_task):
                end = min(start + self.rows_per_task, shard.rows)
                tasks.append(Task(self.next_id, epoch, shard.name, start, end))
                self.next_id += 1
        # Shuffle the order of tasks per epoch, reproducibly (one generator per epoch).
        random.Random(self.seed * 1_000_003 + epoch).shuffle(tasks)
        self.todo.extend(tasks)
        self.materialized_epochs = epoch + 1

    def next_task(self, trainer: str, request_id: str | None = None) -> Task | Next:
        """Hand the next task to ``trainer``.

        ``request_id`` makes the call idempotent: a retried request (the answer was
        lost on the wire) gets the same task again instead of a second one.
        """
        h = self.held.setdefault(trainer, _Held())
        replayed = self.replay(trainer, request_id)
        if replayed is not None:
            return replayed
        if not self.todo and self.materialized_epochs < self.epochs:
            self._materialize(self.materialized_epochs)
        if not self.todo:
            answer: Task | Next = Next.FINISHED if self.finished else Next.WAIT
            h.last_request, h.last_answer = request_id, []
            return answer
        task = self.todo.popleft()
        h.tasks.append(task)
        h.last_request, h.last_answer = request_id, [task]
        return task

    def replay(self, trainer: str, request_id: str | None) -> Task | Next | None:
        """The answer ``next_task`` gave ``trainer``'s last request if ``request_id`` is that request's (None:
        another request)."""
        h = self.held.get(trainer)
        if h is None or request_id is None or request_id != h.last_request:
            return None
        return h.last_answer[0] if h.last_answer else Next.WAIT

    def _find(self, h: _Held, task_id: int) -> int:
        for i, t in enumerate(h.tasks):
            if t.id == task_id:
                return i
        return -1

    def commit(self, trainer: str, cursor: Cursor | None) -> None:
        """Record that ``trainer`` consumed everything before ``cursor`` (idempotent).

        Cursors only move forward; an older or unknown cursor changes nothing.
        """
        h = self.held.get(trainer)
        if h is None or cursor is None:
            return
        i = self._find(h, cursor.task_id)
        if i < 0:
            return
        if i == 0 and cursor.offset <= h.offset:
            return
        # Tasks before the cursor's task are fully consumed.
        for t in h.tasks[:i]:
            self.done_rows[t.epoch] += t.size - (h.offset if t is h.tasks[0] else 0)
        if i > 0:
            h.offset = 0
        cur = h.tasks[i]
        self.done_rows[cur.epoch] += cursor.offset - h.offset
        h.tasks = h.tasks[i:]
        h.offset = cursor.offset
        if h.offset >= cur.size:
            h.tasks.pop(0)
            h.offset = 0

    def release(self, trainer: str, cursor: Cursor | None, failed: bool) -> None:
        """``trainer`` leaves: commit up to ``cursor``, return the rest to the front of todo.

        With ``failed`` the task in progress counts a failure; past the limit the
        job fails with an error naming the shard.
        """
        self.commit(trainer, cursor)
        h = self.held.pop(trainer, None)
        if h is None:
            return
        returned: list[Task] = []
        for i, t in enumerate(h.tasks):
            start = t.start + (h.offset if i == 0 else 0)
            in_progress = i == 0 and cursor is not None and cursor.task_id == t.id
            failures = _since_progress(t, start) + (1 if failed and in_progress else 0)
            if failures > self.max_task_failures:
                raise TaskFailedError(
                    f"{t.describe()} failed {failures} times with none of its rows done between "
                    f"(limit {self.max_task_failures}); check shard {t.shard}"
                )
            if start == t.start and failures == t.failures:
                returned.append(t)
            else:
                returned.append(Task(self.next_id, t.epoch, t.shard, start, t.end, failures))
                self.next_id += 1
        self.todo.extendleft(reversed(returned))

    def fail_task(self, trainer: str, task_id: int, reason: str) -> None:
        """A trainer could not process a task (e.g. unreadable rows): count it and return it."""
        h = self.held.get(trainer)
        if h is None:
            return
        i = self._find(h, task_id)
        if i < 0:
            return
        t = h.tasks[i]
        start = t.start + (h.offset if i == 0 else 0)
        failures = _since_progress(t, start) + 1
        if failures > self.max_task_failures:
            raise TaskFailedError(f"{t.describe()} failed {failures} times with none of its rows done between: "
                                  f"{reason}")
        if i == 0:
            h.offset = 0
        del h.tasks[i]
        self.todo.appendleft(Task(self.next_id, t.epoch, t.shard, start, t.end, failures))
        self.next_id += 1

    def remove_consumed(self, epoch: int, shard: str, start: int, end: int) -> bool:
        """Rows ``[start, end)`` of ``shard`` in ``epoch`` were consumed where this queue cannot see it
        (under a master that died): mark them done and cut them out of the tasks to do.

        ``False``, changing nothing, unless every one of those rows is still to do here: a row consumed
        twice, or one this queue never had, means the report does not fit this queue.
        """
        if end <= start:
            return True
        while self.materialized_epochs <= epoch < self.epochs:
            self._materialize(self.materialized_epochs)
        overlap = 0
        for t in self.todo:
            if t.epoch == epoch and t.shard == shard:
                overlap += max(0, min(t.end, end) - max(t.start, start))
        if overlap != end - start:
            return False
        kept: deque[Task] = deque()
        for t in self.todo:
            if t.epoch != epoch or t.shard != shard or t.end <= start or t.start >= end:
                kept.append(t)
                continue
            for lo, hi in ((t.start, min(t.end, start)), (max(t.start, end), t.end)):
                if hi > lo:  # a piece left on either side of the consumed rows: a task of its own
                    kept.append(Task(self.next_id, t.epoch, t.shard, lo, hi, t.failures))
                    self.next_id += 1
        self.todo = kept
        self.done_rows[epoch] += end - start
        return True

    # ------------------------------------------------------------ persistence
    def cut(self, cursors: dict[str, Cursor | None]) -> dict:
        """The queue as it stands if every holder stopped at ``cursors``: a checkpoint's view.

        Non-destructive. Holders not in ``cursors`` are treated as having consumed
        only what they already committed.
        """
        probe = copy.deepcopy(self)
        for trainer in list(probe.held):
            probe.release(trainer, cursors.get(trainer), failed=False)
        return probe.to_state()

    def to_state(self) -> dict:
        if any(h.tasks for h in self.held.values()):
            raise ValueError("to_state() needs a queue with no held tasks; use cut()")
        return {
            "epochs": self.epochs,
            "rows_per_task": self.rows_per_task,
            "max_task_failures": self.max_task_failures,
            "seed": self.seed,
            "shards": [asdict(s) for s in self.shards],
            "todo": [asdict(t) for t in self.todo],
            "done_rows": {str(k): v for k, v in self.done_rows.items()},
            "materialized_epochs": self.materialized_epochs,
            "next_id": self.next_id,
        }

    @classmethod
    def from_state(cls, state: dict) -> "TaskQueue":
        q = cls(
            [Shard(**s) for s in state["shards"]],
            state["epochs"],
            state["rows_per_task"],
            state["max_task_failures"],
            state["seed"],
        )
        q.todo = deque(Task(**t) for t in state["todo"])
        q.done_rows = {int(k): v for k, v in state["done_rows"].items()}
        q.materialized_epochs = state["materialized_epochs"]
        q.next_id = state["next_id"]
        return q
