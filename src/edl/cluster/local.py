"""Local processes as the job's "cluster": spawn, watch and stop master and trainers.

Children die with the launcher (``PR_SET_PDEATHSIG``), so a killed ``edl train``
leaves no orphans behind; their output goes to one log file each.
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from edl.api.cluster import PodPhase
from edl.api.cluster import MasterEndpoint, TrainerExit, TrainerPod
from edl.errors import UserError
from edl.files import write_json_atomic
from edl.console import clip
from edl.jobargs import spec_to_argv
from edl.api.spec import JobSpec
from edl.net import free_port

log = logging.getLogger("edl.launcher")

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

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def spawn(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> Proc:
        log_path = self.log_path(name)
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


class LocalCluster:
    """The ``Cluster`` of local processes: the master and each trainer are children of the launcher.

    The job's address and token go to ``DIR/job.json`` (mode 0600) so that ``edl status``
    and ``edl scale`` can reach the master.
    """

    def __init__(self, spec: JobSpec, job_dir: Path, env: dict[str, str]) -> None:
        self.spec = spec
        self.dir = job_dir
        self.procs = LocalProcesses(job_dir / "logs", env)
        self.token = secrets.token_urlsafe(32)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.master: Proc | None = None
        self.procs_by_name: dict[str, Proc] = {}

    def _save(self) -> None:
        write_json_atomic(self.dir / "job.json", {
            "job": self.spec.job, "address": self.address, "token": self.token, "launcher_pid": os.getpid(),
            "master_pid": self.master.pid if self.master else None,
            "trainers": {k: p.pid for k, p in self.procs_by_name.items() if p.poll() is None},
        }, mode=0o600)  # it holds the job token

    def _spawn_master(self) -> None:
        self.master = self.procs.spawn("master", ["master", *spec_to_argv(self.spec), "--port", str(self.port)],
                                       {"EDL_TOKEN": self.token})
        self._save()

    # ------------------------------------------------------------ Cluster
    def ensure_job(self) -> MasterEndpoint:
        adopted = self.master is not None  # this launcher made it before: adopt it, never a second master
        if not self.master_alive():
            self._spawn_master()
        return MasterEndpoint(self.address, self.token, adopted)

    def master_alive(self) -> bool:
        return self.master is not None and self.master.poll() is None

    def recreate_master(self) -> None:
        if self.master is not None and self.master.poll() == 2:  # it refused the job: restarting cannot help
            raise UserError(self.master.last_line().removeprefix("edl: error: ") or "the master refused the job")
        self._spawn_master()

    def trainers(self) -> list[TrainerPod]:
        out = []
        for name, p in self.procs_by_name.items():
            code = p.poll()
            if code is None:
                out.append(TrainerPod(name, PodPhase.RUNNING, p.started_at, "localhost"))
            elif code == 0:
                out.append(TrainerPod(name, PodPhase.SUCCEEDED, p.started_at, "localhost", TrainerExit.SUCCEEDED))
            else:
                line = p.last_line()
                if code == 2:
                    out.append(TrainerPod(name, PodPhase.FAILED, p.started_at, "localhost", TrainerExit.USER_ERROR,
                                          line.removeprefix("edl: error: ")))
                else:
                    out.append(TrainerPod(name, PodPhase.FAILED, p.started_at, "localhost", TrainerExit.FAILED,
                                          f"exit code {code}: {clip(line)}"))
        return out

    def create_trainer(self, name: str, node: str | None = None) -> None:  # one machine: no node to prefer
        args = ["trainer", "--id", name, "--master", self.address]  # --audit: the log goes under the checkpoints
        # EDL_TRAINER_LOG: where a trainer whose user code raised says its traceback is (its output's file).
        self.procs_by_name[name] = self.procs.spawn(name, args, {"EDL_TOKEN": self.token,
                                                                 "EDL_TRAINER_LOG": str(self.procs.log_path(name))})
        self._save()

    def delete_trainer(self, name: str) -> None:
        p = self.procs_by_name.pop(name, None)
        if p is not None:
            LocalProcesses.stop_all([p], 3.0)
            self._save()

    def delete_job(self) -> None:
        procs = list(self.procs_by_name.values()) + ([self.master] if self.master else [])
        LocalProcesses.stop_all(procs, 3.0)
        self.procs_by_name.clear()

    def record(self, reason: str, message: str, warning: bool = False) -> None:
        log.log(logging.WARNING if warning else logging.INFO, "%s: %s", reason, message)
