"""Whether a process on this machine has ended, read from ``/proc`` (no signal is sent)."""

from __future__ import annotations

import time
from pathlib import Path


def ended(pid: int) -> bool:
    """No such process, or a zombie: killed or exited, not yet reaped by its parent (ended all the
    same). ``False`` where ``/proc`` cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_ended(pid: int, timeout_s: float, every_s: float = 0.05) -> bool:
    """``ended(pid)`` within ``timeout_s`` seconds (polled every ``every_s``)."""
    deadline = time.monotonic() + timeout_s
    while not ended(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
    return True
