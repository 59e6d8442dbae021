"""Local processes as the job's "cluster": spawn, watch and stop master and trainers.

Children die with the launcher (``PR_SET_PDEATHSIG``), so a killed ``edl train``
leaves no orphans behind; their output goes to one log file each.

A spare master waits beside the master (``edl master --standby``: its imports done, nothing
read or served) and is woken when the master dies, so that the trainers wait for a restart
without a Python start-up in it. It is started ``STANDBY_AFTER_S`` after each master, not with it:
the job's start has the machine to itself. It is started on the launcher's own thread (when the
launcher asks whether the master is alive): a child's ``PR_SET_PDEATHSIG`` fires when the *thread*
that started it ends, so a spare started from a timer thread was killed at once.
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
STANDBY_AFTER_S = 5.0  # a spare master is started this long after each master
# "0": no spare (it holds about 40 MB; without it a restart is a cold start, as on Kubernetes)
STANDBY_ENV = "EDL_STANDBY_MASTER"


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

    def spawn(self, name: str, args: list[str], extra_env: dict[str, str] | None = None,
              stdin_pipe: bool = False, own_session: bool = False) -> Proc:
        log_path = self.log_path(name)
        f = log_path.open("ab")
        env = dict(self.env)
        env.update(extra_env or {})
        popen = subprocess.Popen(
            [sys.executable, "-m", "edl", *args],
            stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            env=env, preexec_fn=_die_with_parent, close_fds=True, start_new_session=own_session,
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


def _wake(standby: Proc) -> bool:
    """Start a spare master (a line on its stdin); ``False`` if it is gone."""
    if standby.poll() is not None or standby.popen.stdin is None:
        return False
    try:
        standby.popen.stdin.write(b"start\n")
        standby.popen.stdin.close()
    except OSError:  # it died meanwhile
        return False
    return True


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
        self.standby: Proc | None = None  # the spare master (``edl master --standby``), once started
        self._standby_due: float | None = None  # when to start the next spare (monotonic)
        self.procs_by_name: dict[str, Proc] = {}

    def _save(self) -> None:
        write_json_atomic(self.dir / "job.json", {
            "job": self.spec.job, "address": self.address, "token": self.token, "launcher_pid": os.getpid(),
            "master_pid": self.master.pid if self.master else None,
            "standby_pid": self.standby.pid if self.standby else None,
            "trainers": {k: p.pid for k, p in self.procs_by_name.items() if p.poll() is None},
        }, mode=0o600)  # it holds the job token

    def _master_args(self) -> list[str]:
        return ["master", *spec_to_argv(self.spec), "--port", str(self.port)]

    def _spawn_master(self) -> None:
        standby, self.standby = self.standby, None
        if standby is not None and _wake(standby):
            self.master = standby
        else:
            self.master = self.procs.spawn("master", self._master_args(), {"EDL_TOKEN": self.token})
        self._save()
        if self.procs.env.get(STANDBY_ENV, "1") != "0":
            self._standby_due = time.monotonic() + STANDBY_AFTER_S

    def _keep_standby(self) -> None:
        """Start the spare once it is due (on the launcher's thread: see the module's docstring)."""
        if self._standby_due is None or time.monotonic() < self._standby_due:
            return
        self._standby_due = None
        if self.standby is None or self.standby.poll() is not None:
            self.standby = self.procs.spawn("master", [*self._master_args(), "--standby"], {"EDL_TOKEN": self.token},
                                            stdin_pipe=True)
            self._save()

    # ------------------------------------------------------------ Cluster
    def ensure_job(self) -> MasterEndpoint:
        adopted = self.master is not None  # this launcher made it before: adopt it, never a second master
        if not self.master_alive():
            self._spawn_master()
        return MasterEndpoint(self.address, self.token, adopted)

    def master_alive(self) -> bool:
        self._keep_standby()  # the launcher asks on every round
        return self.master is not None and self.master.poll() is None

    def recreate_master(self) -> str:
        if self.master is not None and self.master.poll() == 2:  # it refused the job: restarting cannot help
            raise UserError(self.master.last_line().removeprefix("edl: error: ") or "the master refused the job")
        self._spawn_master()
        return self.address

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
        # A session of its own, as paddle.distributed.launch gives each worker: where the kernel groups
        # processes by session for CPU shares (autogroup, on in most distributions), each trainer then
        # gets a share of a busy machine, as a DataParallel worker does, instead of all of the job's
        # processes sharing one. It still dies with the launcher (``PR_SET_PDEATHSIG``), which stops it.
        self.procs_by_name[name] = self.procs.spawn(name, args, {"EDL_TOKEN": self.token,
                                                                 "EDL_TRAINER_LOG": str(self.procs.log_path(name))},
                                                    own_session=True)
        self._save()

    def delete_trainer(self, name: str) -> None:
        p = self.procs_by_name.pop(name, None)
        if p is not None:
            LocalProcesses.stop_all([p], 3.0)
            self._save()

    def delete_job(self) -> None:
        self._standby_due = None
        standby, self.standby = self.standby, None
        procs = list(self.procs_by_name.values()) + [p for p in (self.master, standby) if p is not None]
        LocalProcesses.stop_all(procs, 3.0)
        self.procs_by_name.clear()

    def record(self, reason: str, message: str, warning: bool = False) -> None:
        log.log(logging.WARNING if warning else logging.INFO, "%s: %s", reason, message)
