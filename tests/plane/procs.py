"""Processes of the plane: free loopback ports, and stopping a process group for good."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def machine_lock(path: Path, timeout_s: float | None = None, holder: str = "another process") -> Iterator[None]:
    """Held by one process of this machine at a time (an flock: a holder that dies lets go). Waits up to
    ``timeout_s`` (None: as long as it takes), then a RuntimeError naming ``holder``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with open(path, "w") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (fcntl.LOCK_NB if deadline is not None else 0))
                break
            except BlockingIOError:
                if time.monotonic() > deadline:  # type: ignore[operator]
                    raise RuntimeError(f"{holder} held {path} for over {timeout_s:.0f} s") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def stop_pid(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the process group of ``pid``, then SIGKILL what is left after ``grace_s``."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:  # reap it if it is our child
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                break
        except ChildProcessError:
            break
        time.sleep(0.02)


def wait_until_answers(proc: subprocess.Popen, url: str, timeout_s: float, what: str, log: Path,
                       error: type[Exception] = RuntimeError) -> None:
    """Wait for the server ``proc`` to answer ``url`` with 200. If it exits first, or does not answer
    within ``timeout_s`` (it is stopped then), raise ``error`` with the tail of its ``log``."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise error(f"{what} exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    stop_pid(proc.pid, 5)
    raise error(f"{what} did not answer {url} within {timeout_s:.0f} s")
