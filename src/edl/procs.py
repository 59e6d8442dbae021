"""Processes on this machine, read from ``/proc`` (no signal is sent): whether one ended, which one a pid
is, and the exit code one left for a launcher that is not its parent."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import NoReturn


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


def start_ticks(pid: int) -> int | None:
    """When the process ``pid`` started (clock ticks since boot, ``/proc/PID/stat``'s 22nd field): with
    the pid, which process it is (a pid is reused, a pid and its start are not). ``None`` once it has
    ended (or where ``/proc`` cannot tell)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def same_process(pid: int | None, ticks: int | None) -> bool:
    """``pid`` is alive and is still the process that started at ``ticks``."""
    return pid is not None and ticks is not None and start_ticks(pid) == ticks


# Where a process started by a launcher leaves its exit code: a relaunched launcher that adopted it is
# not its parent and cannot wait for it (``edl.cluster.local``).
EXIT_FILE_ENV = "EDL_EXIT_FILE"


def record_exit(code: int) -> None:
    """Leave ``code`` in the file ``EDL_EXIT_FILE`` names, if it names one (best effort: the process is
    leaving)."""
    path = os.environ.get(EXIT_FILE_ENV)
    if path:
        try:
            Path(path).write_text(f"{code}\n")
        except OSError:
            pass


def recorded_exit(path: Path) -> int | None:
    """The exit code a process left in ``path``; ``None`` if it left none (killed, or still running)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def end_on_sigterm_as_init() -> None:
    """As the first process of a container (PID 1), a signal with no handler of its own is dropped by the
    kernel, so a pod deleted while this process still imports its framework would wait out its whole
    grace period. Until the process sets its own handler, SIGTERM ends it as it would any other
    process (exit 143). Elsewhere the default stays."""
    if os.getpid() == 1:
        signal.signal(signal.SIGTERM, lambda signum, _frame: leave_process(128 + signum))


def leave_process(code: int) -> NoReturn:
    """End this process at once with ``code``: output flushed, the code left (``record_exit``), no
    interpreter teardown (a framework's threads still running abort the process when it destroys what
    they use: a clean exit turned into SIGABRT)."""
    record_exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
