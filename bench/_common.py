"""Helpers for the benchmarks: run edl jobs in the background and read their status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from edl.launcher.local import local_job_status

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


class EdlJob:
    def __init__(self, name: str, args: list[str], home: Path, log: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.home = home
        env = {**os.environ, "EDL_HOME": str(home), "PYTHONUNBUFFERED": "1", **(env or {})}
        self.log = log.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "edl", "train", "--job-name", name, *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def info(self) -> dict:
        return json.loads((self.home / "jobs" / self.name / "job.json").read_text())

    def status(self) -> dict | None:
        """The master's status in its JSON form (``None`` while it cannot be read)."""
        st = local_job_status(self.name, self.home)
        return None if st is None else st.to_json()

    def wait_for(self, pred, timeout: float = 300) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if st is not None and pred(st):
                return st
            if self.proc.poll() is not None:
                raise RuntimeError(f"job {self.name} ended early (code {self.proc.returncode})")
            time.sleep(0.05)
        raise TimeoutError(f"job {self.name}: condition not reached")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                self._kill_left()
        self.log.close()

    def _kill_left(self) -> None:
        """SIGKILL what a launcher killed without its cleanup left running (they outlive it, for a relaunch)."""
        try:
            info = self.info()
        except (OSError, ValueError):
            return
        for pid in [info.get("master_pid"), info.get("standby_pid"), *(info.get("trainers") or {}).values()]:
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def provenance(script: str, argv: list[str]) -> dict[str, str]:
    """What a result file names of its making: the command as run and the commit of the tree it ran
    (``-dirty`` when the code it measures had changes not committed)."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "src", "tests/plane", "tools", "bench",
                                 ":!bench/results"], cwd=ROOT, capture_output=True, text=True).stdout.strip())
    return {"command": " ".join(["python", script, *argv]), "commit": commit + ("-dirty" if dirty else "")}


def write_result(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


class MasterDouble:
    """A job's master as its sidecar reads it (``ControlLink``): a running job at ``desired`` trainers, for
    the benchmarks that measure the sidecar (its cluster view, its policy), not the master."""

    def __init__(self, job: str, desired: int, min_trainers: int, max_trainers: int) -> None:
        self.job, self.desired, self.min, self.max = job, desired, min_trainers, max_trainers
        self.hints: tuple[str, ...] = ()

    def status(self):
        from edl.api.master import JobStatus, JobView, Phase

        return JobView(job=self.job, status=JobStatus.RUNNING, error=None, master_uid="1", phase=Phase.RUNNING,
                       generation=1, world_size=self.desired, desired_trainers=self.desired, unschedulable_at=None,
                       min_trainers=self.min, max_trainers=self.max, epoch=0, epochs=1, epochs_completed=0,
                       rows_per_epoch=0, done_rows=(0,), step=0, loss=None, trainers=(), generations=(),
                       checkpoints=(), elapsed_s=0.0, node_hints=self.hints)

    def scale(self, n: int, nodes: tuple[str, ...] = (), reason=None, released=None) -> None:
        self.desired, self.hints = n, tuple(nodes)
