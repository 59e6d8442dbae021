"""Local processes as the job's "cluster": spawn, watch and stop master and trainers.

The master and the trainers outlive a launcher killed without its cleanup (SIGKILL, a closed terminal:
each runs in a session of its own), as pods outlive a step's pod on Kubernetes: the same command run
again within ``--launcher-timeout`` adopts them (``left_job``: its master alive, its launcher not, the
same job) and the job goes on without a restart. Nobody left behind runs for long: a master whose
launcher stopped beating ends the job (``edl.master.deadman``), and its trainers leave with it. A
launcher interrupted (Ctrl-C, SIGTERM) stops them all before it exits.
Each process's output goes to a log file of its own; a trainer leaves its exit code in a file beside it
(``edl.procs.record_exit``) for a launcher that adopted it and so cannot wait for it.

A spare master waits beside the master (``edl master --standby``: its imports done, nothing
read or served) and is woken when the master dies (a line on its stdin), so that the trainers wait for a
restart without a Python start-up in it. It is started ``STANDBY_AFTER_S`` after each master, not with
it: the job's start has the machine to itself. Its stdin closes with the launcher that started it, which
ends it: an adopting launcher starts a spare of its own.
"""

from __future__ import annotations

import json
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
from edl.procs import EXIT_FILE_ENV, recorded_exit, same_process, start_ticks

log = logging.getLogger("edl.launcher")

STANDBY_AFTER_S = 5.0  # a spare master is started this long after each master
# "0": no spare (it holds about 40 MB; without it a restart is a cold start, as on Kubernetes)
STANDBY_ENV = "EDL_STANDBY_MASTER"
KILLED = -signal.SIGKILL  # an adopted process that ended without leaving its exit code was killed


@dataclass
class Proc:
    """A process of the job: a child of this launcher (``Child``), or one a killed launcher left (``Adopted``)."""

    name: str
    log_path: Path
    ticks: int | None  # its start (``edl.procs.start_ticks``): which process its pid is, for a relaunch
    started_at: float = field(default_factory=time.monotonic, kw_only=True)

    @property
    def pid(self) -> int:
        raise NotImplementedError

    def poll(self) -> int | None:
        """Its exit code (negative: the signal that ended it) once it ended, else ``None``."""
        raise NotImplementedError

    def send_signal(self, sig: int) -> None:
        raise NotImplementedError

    def wait(self, timeout_s: float) -> bool:
        """Whether it ended within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.poll() is None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def last_line(self) -> str:
        try:
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        for ln in reversed(lines):
            if ln.startswith("edl: error:") or "Error" in ln:
                return ln
        return lines[-1] if lines else ""


@dataclass
class Child(Proc):
    popen: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def send_signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout_s: float) -> bool:
        try:
            self.popen.wait(timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False


@dataclass
class Adopted(Proc):
    """A process a killed launcher started: alive while its pid is still the process that started at
    ``ticks``; its exit code the one it left in ``exit_path`` (``KILLED`` if none)."""

    own_pid: int
    exit_path: Path | None
    _code: int | None = None

    @property
    def pid(self) -> int:
        return self.own_pid

    def poll(self) -> int | None:
        if self._code is None and not same_process(self.own_pid, self.ticks):
            left = recorded_exit(self.exit_path) if self.exit_path is not None else None
            self._code = KILLED if left is None else left
        return self._code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.own_pid, sig)
            except ProcessLookupError:
                pass


class LocalProcesses:
    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        log_dir.mkdir(parents=True, exist_ok=True)

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def exit_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.exit"

    def spawn(self, name: str, args: list[str], extra_env: dict[str, str] | None = None,
              stdin_pipe: bool = False) -> Child:
        """``python -m edl ARGS`` in a session of its own: a closed terminal or a signal to the launcher's
        process group leaves it running (for a relaunch to adopt), and where the kernel shares a busy CPU
        between sessions (autogroup), each process gets its share (as ``paddle.distributed.launch`` starts
        its workers) instead of the job's processes sharing one."""
        log_path = self.log_path(name)
        f = log_path.open("ab")
        env = dict(self.env)
        env.update(extra_env or {})
        popen = subprocess.Popen(
            [sys.executable, "-m", "edl", *args],
            stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            env=env, close_fds=True, start_new_session=True,
        )
        f.close()
        return Child(name, log_path, start_ticks(popen.pid), popen)

    @staticmethod
    def stop_all(procs: list[Proc], grace_s: float = 5.0) -> None:
        """SIGTERM every process at once, then SIGKILL whatever is left after ``grace_s``."""
        live = [p for p in procs if p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in live:
            if not p.wait(max(0.0, deadline - time.monotonic())):
                p.send_signal(signal.SIGKILL)
                p.wait(5.0)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _wake(standby: Proc) -> bool:
    """Start a spare master (a line on its stdin); ``False`` if it is gone (or not this launcher's)."""
    if not isinstance(standby, Child) or standby.poll() is not None or standby.popen.stdin is None:
        return False
    try:
        standby.popen.stdin.write(b"start\n")
        standby.popen.stdin.close()
    except OSError:  # it died meanwhile
        return False
    return True


@dataclass(frozen=True)
class LeftJob:
    """A job a killed launcher left running in its directory, to adopt: its master alive, its launcher
    not, the same job with the same arguments (``left_job``)."""

    address: str
    token: str
    master: Adopted
    standby: Adopted | None
    trainers: dict[str, Adopted]


def left_job(spec: JobSpec, job_dir: Path) -> LeftJob | None:
    """The job a killed launcher of ``spec`` left running in ``job_dir`` (its ``job.json``), if any."""
    try:
        info = json.loads((job_dir / "job.json").read_text())
    except (OSError, ValueError):
        return None
    ticks = {int(pid): t for pid, t in (info.get("ticks") or {}).items()}

    def alive(pid: int | None) -> bool:
        return pid is not None and same_process(pid, ticks.get(pid))

    if info.get("argv") != spec_to_argv(spec) or alive(info.get("launcher_pid")) or not alive(info.get("master_pid")):
        return None
    logs = job_dir / "logs"

    def adopted(name: str, pid: int, exit_file: bool) -> Adopted:
        return Adopted(name, logs / f"{name}.log", ticks.get(pid), pid, logs / f"{name}.exit" if exit_file else None)

    standby = info.get("standby_pid")
    return LeftJob(info["address"], info["token"], adopted("master", info["master_pid"], False),
                   adopted("master", standby, False) if alive(standby) else None,
                   {name: adopted(name, pid, True) for name, pid in (info.get("trainers") or {}).items()})


class LocalCluster:
    """The ``Cluster`` of local processes: the master and each trainer started by this launcher, or
    adopted from a killed one (``adopt``).

    The job's address and token go to ``DIR/job.json`` (mode 0600) so that ``edl status``
    and ``edl scale`` can reach the master; with its processes' pids and starts, for a relaunch to adopt.
    """

    def __init__(self, spec: JobSpec, job_dir: Path, env: dict[str, str], adopt: LeftJob | None = None) -> None:
        self.spec = spec
        self.dir = job_dir
        self.procs = LocalProcesses(job_dir / "logs", env)
        self.master: Proc | None = None
        self.standby: Proc | None = None  # the spare master (``edl master --standby``), once started
        self._standby_due: float | None = None  # when to start the next spare (monotonic)
        self.procs_by_name: dict[str, Proc] = {}
        if adopt is None:
            self.token = secrets.token_urlsafe(32)
            self.port = free_port()
            self.address = f"127.0.0.1:{self.port}"
            return
        self.token, self.address = adopt.token, adopt.address
        self.port = int(adopt.address.rsplit(":", 1)[1])
        self.master = adopt.master
        self.procs_by_name.update(adopt.trainers)
        if adopt.standby is not None:  # it cannot be woken (its stdin was the killed launcher's): a new one
            LocalProcesses.stop_all([adopt.standby], 3.0)
        if self.procs.env.get(STANDBY_ENV, "1") != "0":
            self._standby_due = time.monotonic() + STANDBY_AFTER_S
        self._save()

    def _save(self) -> None:
        procs = [p for p in (self.master, self.standby, *self.procs_by_name.values()) if p is not None]
        me = os.getpid()
        write_json_atomic(self.dir / "job.json", {
            "job": self.spec.job, "address": self.address, "token": self.token, "launcher_pid": me,
            "argv": spec_to_argv(self.spec),
            "master_pid": self.master.pid if self.master else None,
            "standby_pid": self.standby.pid if self.standby else None,
            "trainers": {k: p.pid for k, p in self.procs_by_name.items() if p.poll() is None},
            # Which process each pid is (a pid is reused): a relaunch adopts only these (``left_job``).
            "ticks": {str(pid): t for pid, t in [(me, start_ticks(me)), *((p.pid, p.ticks) for p in procs)]
                      if t is not None},
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
        """Start the spare once it is due."""
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
                else:  # killed by a signal: its last line says what it was doing, not why it ended
                    why = (f"killed by {_signal_name(-code)} (its last line: {clip(line)})" if code < 0
                           else f"exit code {code}: {clip(line)}")
                    out.append(TrainerPod(name, PodPhase.FAILED, p.started_at, "localhost", TrainerExit.FAILED, why))
        return out

    def create_trainer(self, name: str, node: str | None = None) -> None:  # one machine: no node to prefer
        args = ["trainer", "--id", name, "--master", self.address]  # --audit: the log goes under the checkpoints
        # EDL_TRAINER_LOG: where a trainer whose user code raised says its traceback is (its output's file).
        # EDL_EXIT_FILE: where it leaves its exit code for a launcher that adopts it.
        self.procs.exit_path(name).unlink(missing_ok=True)  # an earlier run's trainer of that name left it
        self.procs_by_name[name] = self.procs.spawn(name, args, {"EDL_TOKEN": self.token,
                                                                 "EDL_TRAINER_LOG": str(self.procs.log_path(name)),
                                                                 EXIT_FILE_ENV: str(self.procs.exit_path(name))})
        self._save()

    def delete_trainer(self, name: str) -> None:
        p = self.procs_by_name.pop(name, None)
        if p is not None:
            self._save()  # first: a relaunch must not adopt it
            LocalProcesses.stop_all([p], 3.0)

    def delete_job(self) -> None:
        self._standby_due = None
        standby, self.standby = self.standby, None
        procs = list(self.procs_by_name.values()) + [p for p in (self.master, standby) if p is not None]
        LocalProcesses.stop_all(procs, 3.0)
        self.procs_by_name.clear()

    def record(self, reason: str, message: str, warning: bool = False) -> None:
        log.log(logging.WARNING if warning else logging.INFO, "%s: %s", reason, message)
