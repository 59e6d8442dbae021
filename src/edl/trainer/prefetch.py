"""The trainer's prefetch: keeps two batches of tasks ahead of the loop, on its own thread, and reads
the rows of each new task ahead (``warm``) so that the loop rarely waits for storage."""

from __future__ import annotations

import time
import uuid
from typing import Callable

from edl.api.data import Task
from edl.api.master import Next, TrainerLink
from edl.errors import EdlError
from edl.trainer.data import TaskBuffer
from edl.trainer.progress import Progress


FULL_WAIT_S = 0.5  # a full buffer is waited on this long at most (then ``alive`` is asked again)


class Prefetcher:
    """Asks the master for tasks into ``buffer`` while it holds under two batches."""

    def __init__(self, link: TrainerLink, trainer_id: str, buffer: TaskBuffer, batch_size: int, progress: Progress,
                 sleep: Callable[[float], None] = time.sleep, new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
                 warm: Callable[[Task], None] = lambda task: None, full_wait_s: float = FULL_WAIT_S) -> None:
        self.link = link
        self.id = trainer_id
        self.buffer = buffer
        self.batch_size = batch_size
        self.progress = progress
        self.sleep = sleep
        self.new_id = new_id
        self.warm = warm
        self.full_wait_s = full_wait_s
        self.finished = False  # the master has handed out every task of every epoch
        self._request_id = new_id()
        self._request_lineage = buffer.ticket()[1]  # the buffer's lineage ``_request_id`` was made under

    def restart(self, key: tuple[str, int] = ("", 0)) -> None:
        """Drop the tasks held: generation ``key`` starts from the master's queue (checkpoint or fresh)."""
        self.buffer.clear(key)
        self.finished = False

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
        if self.buffer.remaining() >= 2 * self.batch_size:
            # Woken by the loop's next batch, not a poll: a poll of 100 a second cost the trainer about
            # 5 ms of CPU a second, beside a loop that needs all of it.
            self.buffer.wait_below(2 * self.batch_size, self.full_wait_s)
            return
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
            self.finished = True
        else:
            self.sleep(0.05)
