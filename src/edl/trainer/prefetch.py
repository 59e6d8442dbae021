"""The trainer's prefetch: keeps two batches of tasks ahead of the loop, on its own thread, and reads
the rows of each new task ahead (``warm``) so that the loop rarely waits for storage."""

from __future__ import annotations

import random
import time
import uuid
from typing import Callable

from edl.api.data import Task
from edl.api.master import Next, TrainerLink
from edl.errors import EdlError
from edl.trainer.data import TaskBuffer
from edl.trainer.progress import Progress


FULL_WAIT_S = 0.5  # a full buffer is waited on this long at most (then ``alive`` is asked again)
ASK_SHARE = 0.5  # of the time the held rows last: a request waits at most this share of it (see AskPace)
MAX_ASK_DELAY_S = 1.0
PACE_ALPHA = 0.3


class AskPace:
    """When the prefetch asks for its next task: at a random moment of the first half of the time the rows
    it holds still last, not at once.

    The ranks of a job take their batches in lockstep, so every trainer's buffer drops under two batches in
    the same step: asked at once, the master gets one request per trainer in the same few milliseconds
    (1,024 at 1,024 trainers) and answers them one after another, the last after all the others. Waiting a
    random share (``u``) of half the time the held rows last at the loop's pace spreads the requests over
    that time; the request still goes with half the slack left for its answer, and at once whenever the
    pace is not known yet (the trainer's first rows) or the loop holds less than a batch (``Prefetcher``).
    The pace is the rows the loop took over the time between two observations that saw it take some."""

    def __init__(self, alpha: float = PACE_ALPHA, share: float = ASK_SHARE) -> None:
        self.alpha = alpha
        self.share = share  # 0: ask at once (bench/master_scale.py --ask-share 0, the trainers before this)
        self.rows_per_s: float | None = None
        self._last: tuple[float, int] | None = None  # (time, rows taken) when the count last moved

    def observe(self, now: float, rows_taken: int) -> None:
        last = self._last
        if last is None or rows_taken < last[1]:
            self._last = (now, rows_taken)
            return
        if rows_taken == last[1] or now <= last[0]:
            return
        rate = (rows_taken - last[1]) / (now - last[0])
        self.rows_per_s = rate if self.rows_per_s is None else (1 - self.alpha) * self.rows_per_s + self.alpha * rate
        self._last = (now, rows_taken)

    def restart(self) -> None:
        """A new generation: the time until its first rows is not the loop's pace (the pace measured before
        it still sets the delays until the loop has taken rows again)."""
        self._last = None

    def delay_s(self, held_rows: int, u: float) -> float:
        """How long to wait before asking, holding ``held_rows``; ``u`` uniform in [0, 1)."""
        if not self.rows_per_s or held_rows <= 0:
            return 0.0
        return min(MAX_ASK_DELAY_S, u * self.share * held_rows / self.rows_per_s)


class Prefetcher:
    """Asks the master for tasks into ``buffer`` while it holds under two batches."""

    def __init__(self, link: TrainerLink, trainer_id: str, buffer: TaskBuffer, batch_size: int, progress: Progress,
                 sleep: Callable[[float], None] = time.sleep, new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
                 warm: Callable[[Task], None] = lambda task: None, full_wait_s: float = FULL_WAIT_S,
                 clock: Callable[[], float] = time.monotonic, uniform: Callable[[], float] = random.random) -> None:
        self.link = link
        self.id = trainer_id
        self.buffer = buffer
        self.batch_size = batch_size
        self.progress = progress
        self.sleep = sleep
        self.new_id = new_id
        self.warm = warm
        self.full_wait_s = full_wait_s
        self.clock, self.uniform = clock, uniform
        self.pace = AskPace()
        self._finished_in: int | None = None  # the buffer's lineage in which the master said it handed out all
        self._request_id = new_id()
        self._request_lineage = buffer.ticket()[1]  # the buffer's lineage ``_request_id`` was made under

    def restart(self, key: tuple[str, int] = ("", 0)) -> None:
        """Drop the tasks held: generation ``key`` starts from the master's queue (checkpoint or fresh)."""
        self.buffer.clear(key)
        self.pace.restart()

    @property
    def finished(self) -> bool:
        """The master has handed out every task of every epoch, as it said since the buffer was last replaced
        (a generation that starts from a checkpoint has tasks to hand out again)."""
        return self._finished_in is not None and self._finished_in == self.buffer.ticket()[1]

    def out_of_data(self) -> bool:
        return self.finished and self.buffer.remaining() == 0

    def run(self, alive: Callable[[], bool]) -> None:
        while alive():
            self.fetch()

    def fetch(self) -> None:
        """One round: ask for a task if one is wanted now, else pause a little."""
        if self.finished or self.progress.generation == 0:
            self.sleep(0.01)
            return
        self.pace.observe(self.clock(), self.buffer.rows_taken)
        held = self.buffer.remaining()
        if held >= 2 * self.batch_size:
            # Woken by the loop's next batch, not a poll: a poll of 100 a second cost the trainer about
            # 5 ms of CPU a second, beside a loop that needs all of it.
            self.buffer.wait_below(2 * self.batch_size, self.full_wait_s)
            return
        delay = self.pace.delay_s(held, self.uniform())
        if delay > 0:
            # Spread out from the other ranks' requests (AskPace), unless the loop runs short first.
            self.buffer.wait_below(self.batch_size, delay)
        # The request names the generation the buffer holds tasks for: the master answers it only in that
        # generation, and its task is held only if the buffer was not replaced meanwhile. Without both, a
        # task handed out across a change was lost (held by the master's count, dropped by the trainer's
        # new start) or trained twice (taken back at a restart, kept by the trainer).
        (master_uid, generation), lineage = self.buffer.ticket()
        if lineage != self._request_lineage:
            # A retry after the change would be answered with the task of before it (``next_task`` is
            # idempotent per request id), which the change's assignment already accounted for.
            self._request_id, self._request_lineage = self.new_id(), lineage
        try:
            r = self.link.next_task(self.id, self._request_id, self.progress.safe_cursor, master_uid=master_uid,
                                    generation=generation)
        except EdlError:
            self.sleep(0.2)  # same request id next time: a lost answer is handed out again, not twice
            return
        self._request_id = self.new_id()
        if isinstance(r, Task):
            if self.buffer.add(r, lineage):
                self.warm(r)
        elif r is Next.FINISHED:
            self._finished_in = lineage  # said of the buffer the request was made for, not a later one
        else:
            self.sleep(0.05)
