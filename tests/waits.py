"""One way for tests to wait for a condition: poll it, and say what did not happen."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(pred: Callable[[], T], timeout: float = 60, what: str = "condition", every: float = 0.2,
             detail: Callable[[], str] = lambda: "") -> T:
    """The first truthy value of ``pred()`` within ``timeout`` seconds; else an AssertionError naming
    ``what``, the last value seen and ``detail()`` (logs, say)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(every)
    extra = detail()
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})"
                         + (f"\n{extra}" if extra else ""))
