"""Local processes as the job's "cluster": spawn, watch and stop master and trainers.

Children die with the launcher (``PR_SET_PDEATHSIG``), so a killed ``edl train``
leaves no orphans behind; their output goes to one log file each.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def last_line(self) -> str:
        try:
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        for ln in reversed(lines):
            if ln.startswith("edl: error:") or "Error" in ln:
                return ln
        return lines[-1] if lines else ""


class LocalProcesses:
    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        log_dir.mkdir(parents=True, exist_ok=True)

    def spawn(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> Proc:
        log_path = self.log_dir / f"{name}.log"
        f = log_path.open("ab")
        env = dict(self.env)
        env.update(extra_env or {})
        popen = subprocess.Popen(
            [sys.executable, "-m", "edl", *args],
            stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, preexec_fn=_die_with_parent, close_fds=True,
        )
        f.close()
        return Proc(name, popen, log_path)

    @staticmethod
    def stop_all(procs: list[Proc], grace_s: float = 5.0) -> None:
        """SIGTERM every process at once, then SIGKILL whatever is left after ``grace_s``."""
        live = [p for p in procs if p.poll() is None]
        for p in live:
            p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in live:
            try:
                p.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
