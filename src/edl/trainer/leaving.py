"""A trainer told to stop leaves as a drained trainer does (``Leaving``).

SIGTERM reaches a trainer when the cluster takes its place: its pod preempted by a higher-priority
one, evicted, deleted, or its node drained; Kubernetes then waits the pod's grace period before
SIGKILL. A trainer that died at once would cost its peers a failed collective and a rollback to
their last common step; one that ignored the signal would keep them waiting until its lease ran
out. Instead it asks the master to drain it: the survivors prepare the next generation while all
train on, and it leaves at the switch (exit 0), within a step or two of the signal.

Where that cannot happen it exits at once (before it registered, the master unreachable or gone
while it waits, a second signal) or after ``timeout_s`` (the switch never came): a crash its peers
recover from as from any.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Callable

from edl.api.master import TrainerLink
from edl.errors import EdlError

log = logging.getLogger(__name__)

# Well inside Kubernetes' default grace period (30 s) and the trainer pods' own.
LEAVE_TIMEOUT_S = 15.0


class Leaving:
    """The trainer's SIGTERM handler: ``leaving(signum)``. ``registered`` is set once the
    master knows the trainer (before that there is nothing to drain); ``ended`` once its loop is over
    (it left, or the job ended): the clean end that follows (a last checkpoint's flush) is not cut short."""

    def __init__(self, trainer_id: str, link: TrainerLink, exit_process: Callable[[int], None], *,
                 timeout_s: float = LEAVE_TIMEOUT_S, poll_s: float = 0.5,
                 start: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.trainer_id = trainer_id
        self.link = link
        self.exit_process = exit_process
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.start = start or _thread
        self.registered = False
        self.asked: int | None = None  # the signal that asked us to leave
        self.ended = threading.Event()  # the trainer's loop is over: what is left is its own clean end

    def __call__(self, signum: int, _frame: object = None) -> None:
        # In a signal handler: nothing here may block, so the master is told on a thread of its own.
        code = 128 + signum
        if self.asked is not None or not self.registered:
            self.exit_process(code)
            return
        self.asked = signum
        log.info("trainer %s told to stop (%s); leaving at the job's next change", self.trainer_id,
                 signal.Signals(signum).name)
        self.start(self._ask)

    def _ask(self) -> None:
        assert self.asked is not None
        code = 128 + self.asked
        deadline = time.monotonic() + self.timeout_s
        while True:
            # Asked again each round (a drain is idempotent): a master that stopped answering is being
            # torn down with the rest of the job (a cancel, a deleted namespace), and then nothing is
            # worth waiting for.
            try:
                self.link.leave(self.trainer_id)
            except EdlError as e:
                log.info("trainer %s: the master did not take the drain (%s); exiting now", self.trainer_id, e)
                self.exit_process(code)
                return
            if self.ended.wait(min(self.poll_s, max(0.0, deadline - time.monotonic()))):
                return
            if time.monotonic() >= deadline:
                log.warning("trainer %s: still in the job %.0f s after being told to stop; exiting now",
                            self.trainer_id, self.timeout_s)
                self.exit_process(code)
                return


def _thread(fn: Callable[[], None]) -> None:
    threading.Thread(target=fn, name="edl-leaving", daemon=True).start()
