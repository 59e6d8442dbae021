"""The one fake clock of the unit tests: monotonic, injected, moving only when the code under test sleeps."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class FakeClock:
    """``clock()`` reads the time; ``clock.sleep(s)`` moves it on (and adds to ``slept``), then calls
    ``on_sleep``: a test's way of playing the other side meanwhile (a run renewing its lock, say)."""

    def __init__(self, t: float = 0.0, on_sleep: Callable[[], object] = lambda: None) -> None:
        self.t = t
        self.slept = 0.0
        self.on_sleep = on_sleep

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
        self.slept += s
        self.on_sleep()


class FakeClockLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop whose time is ``clock``'s: its timers (``asyncio.timeout``, ``asyncio.sleep``)
    fire once a test has moved the clock past them (``clock.sleep``, from any thread), never on their own.
    ``deadlines`` lists when each timer set on it is due, in the order they were set: a test's way of
    knowing that the code under test is waiting, and for how long."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.deadlines: list[float] = []
        self.timer_set = threading.Condition()
        moved = clock.on_sleep

        def wake() -> None:
            moved()
            try:
                self.call_soon_threadsafe(lambda: None)  # the loop looks at its timers again
            except RuntimeError:
                pass  # closed

        clock.on_sleep = wake

    def time(self) -> float:
        return self.clock()

    def call_at(self, when, callback, *args, context=None):  # type: ignore[no-untyped-def]
        handle = super().call_at(when, callback, *args, context=context)
        with self.timer_set:
            self.deadlines.append(when)
            self.timer_set.notify_all()
        return handle

    def wait_deadline(self, when: float, timeout_s: float = 10.0) -> bool:
        """Until a timer due at ``when`` has been set (real time, ``timeout_s`` at most)."""
        with self.timer_set:
            return self.timer_set.wait_for(lambda: when in self.deadlines, timeout_s)
