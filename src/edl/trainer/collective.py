"""The loop's collectives on a thread of their own, so that the loop can leave one (``Runner``)."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Callable, TypeVar

from edl.api.framework import Group
from edl.errors import Abandoned

T = TypeVar("T")


class Runner:
    """Runs the loop's blocking collectives on a thread of their own, so that the loop can leave one.

    Gloo's calls (Paddle's and PyTorch's) cannot be interrupted, and closing a group from another thread does not
    wake a peer blocked on it: a survivor waiting on another survivor that already gave up would
    wait out Gloo's timeout. So the loop waits on the call here, watching ``abort`` (the master's
    word that the generation failed), and on abort leaves the call to its thread (a daemon, which
    ends when Gloo does) and takes a fresh thread for the next generation.
    """

    def __init__(self, poll_s: float = 0.005) -> None:
        self.poll_s = poll_s
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future]] | None = None
        self._queued: list[Future] = []  # handed to the current thread and maybe not done yet
        self.abandoned = 0  # calls left behind, for the log

    def _serve(self, jobs: queue.SimpleQueue[tuple[Callable[[], object], Future]]) -> None:
        while True:
            fn, fut = jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting loop as is
                fut.set_exception(e)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn`` on the collectives' thread without waiting: calls run one at a time, in the order
        submitted (so a call that finished means every call submitted before it finished too)."""
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(self._jobs,), name="edl-collective", daemon=True).start()
        self._queued = [f for f in self._queued if not f.done()]
        fut: Future[T] = Future()
        self._queued.append(fut)
        self._jobs.put((fn, fut))
        return fut

    def run(self, fn: Callable[[], T], abort: Callable[[], bool], group: Group | None = None) -> T:
        """``fn()``, or ``Abandoned`` as soon as ``abort()`` holds while it runs (``group`` is abandoned too)."""
        if abort():
            if group is not None:
                group.abandon()
            raise Abandoned("the generation was aborted")
        return self.wait(self.submit(fn), abort, group)

    def wait(self, fut: Future[T], abort: Callable[[], bool], group: Group | None = None) -> T:
        """The result of a submitted call, or ``Abandoned`` as soon as ``abort()`` holds while the thread
        works on it or on a call before it: the calls not started are cancelled, and a call already
        running is left to its thread (the next call gets a fresh one)."""
        while True:
            try:
                return fut.result(timeout=self.poll_s)
            except TimeoutError:
                pass
            if abort():
                self.abandon(group)
                raise Abandoned("the generation was aborted while in its collective")

    def abandon(self, group: Group | None = None) -> None:
        """Leave the calls submitted so far: those not started are cancelled, one already running is left to
        its thread (the next call gets a fresh one); ``group`` is abandoned too."""
        if group is not None:
            group.abandon()
        running = [f for f in self._queued if not f.cancel() and not f.done()]
        self._queued = []
        if running:  # its thread stays with it
            self._jobs = None
            self.abandoned += 1
