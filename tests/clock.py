"""The one fake clock of the unit tests: monotonic, injected, moving only when the code under test sleeps."""

from __future__ import annotations

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
