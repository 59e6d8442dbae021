"""``edl train``: run a whole elastic job on this machine as local processes.

The shared ``Launcher`` drives a ``LocalCluster``: it starts the master, keeps the
number of trainers at the master's desired count (spawning, or draining the
youngest first), reports trainer exits, restarts a master that died, and shows
progress. A relaunch of the same command adopts the master and trainers a killed launcher left running
(``edl.cluster.local.left_job``), or else resumes from the checkpoint.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable
from urllib.parse import urlparse

from edl.api.master import JobView
from edl.console import Console, plain_console, say
from edl.autoscale.local_view import SLOT, CapacitySchedule, LocalClusterView
from edl.autoscale.policy import get_policy
from edl.autoscale.sidecar import Sidecar, SidecarConfig
from edl.errors import EdlError, StorageError, UserError
from edl.cluster.local import LocalCluster, left_job
from edl.api.spec import JobSpec
from edl.launcher.core import JobResult, Launcher, ProgressView, audit_summary, http_master
from edl.jobcheck import prepare_job
from edl.launcher.watch import StatusWatch
from edl.masterlink import HttpMaster
from edl.modeldef import require_frameworks_of
from edl.storage.audit import AUDIT_SPOOL_ENV, audit_spool, upload_spool
from edl.storage.store import open_store


def edl_home() -> Path:
    return Path(os.environ.get("EDL_HOME", Path.home() / ".edl"))


def job_dir(job: str, home: Path | None = None) -> Path:
    return (home or edl_home()) / "jobs" / job


def read_job_file(job: str, home: Path | None = None) -> dict:
    path = job_dir(job, home) / "job.json"
    if not path.exists():
        raise UserError(f"no local job named {job!r} (looked for {path})")
    return json.loads(path.read_text())


def local_job_master(job: str, home: Path | None = None, timeout_s: float = 5.0) -> HttpMaster:
    """The master of the local job ``job`` (its address and token from its job file), one attempt per call."""
    info = read_job_file(job, home)
    return HttpMaster(info["address"], info["token"], timeout_s=timeout_s, give_up_s=0.0,
                      name=f"the master of job {job!r}")


def local_job_status(job: str, home: Path | None = None, timeout_s: float = 3.0) -> JobView | None:
    """A running local job's status, or ``None`` while it cannot be read (starting, restarting, gone)."""
    try:
        return local_job_master(job, home, timeout_s).status()
    except (EdlError, OSError, ValueError, KeyError):
        return None


@dataclass(frozen=True)
class LocalAutoscale:
    """Run the autoscale sidecar on this machine: ``slots`` trainer slots, other tenants on a schedule."""

    slots: int
    schedule: CapacitySchedule
    period_s: float = 2.0
    policy: str = "edl"


class RecordingView(ProgressView):
    """Progress display that also hands every status it shows to ``record`` (timelines)."""

    def __init__(self, console: Console, record: Callable[[JobView], None]) -> None:
        super().__init__(console)
        self.record = record

    def show(self, st: JobView) -> None:
        super().show(st)
        self.record(st)


class LocalLauncher:
    def __init__(self, spec: JobSpec, summary_out: Path | None, max_trainer_failures: int = 5,
                 console: Console | None = None, autoscale: LocalAutoscale | None = None,
                 on_status: Callable[[dict], None] | None = None) -> None:
        self.spec = spec
        self.summary_out = summary_out
        self.max_trainer_failures = max_trainer_failures
        self.console = console or plain_console()
        self.dir = job_dir(spec.job)
        self.autoscale = autoscale
        self.on_status = on_status
        self.started_at = time.time()
        self.view: LocalClusterView | None = None
        self._hold: IO[str] | None = None  # the job directory's lock (``hold_job``), while this launcher runs

    def _start_sidecar(self, cluster: LocalCluster, a: LocalAutoscale, stop: threading.Event) -> threading.Thread:
        self.view = LocalClusterView(self.spec.job, a.slots, a.schedule, self.started_at, time.time)
        sidecar = Sidecar(SidecarConfig(self.spec.job, SLOT, self.spec.min_trainers, self.spec.max_trainers,
                                        a.period_s, 0.0),
                          self.view, HttpMaster(cluster.address, cluster.token, timeout_s=5.0, give_up_s=10.0),
                          get_policy(a.policy))
        thread = threading.Thread(target=sidecar.run, args=(stop.is_set, stop.wait), name="edl-sidecar",
                                  daemon=True)
        thread.start()
        return thread

    def run(self) -> int:
        # Before anything is started or written: the framework the model definition imports, installed here.
        require_frameworks_of(self.spec.model_def, "edl train runs its trainers on this machine")
        self.spec, _, ckpts, claim = prepare_job(self.spec)  # fail fast on bad data, storage or a foreign prefix
        # The same job left running by a killed launcher goes on as it is; any other running job is refused
        # before this job's directory is touched: it may be the running one's.
        self._hold = hold_job(self.spec.job, self.dir)  # for this launcher's life: one launcher per job here
        left = left_job(self.spec, self.dir)
        if left is None:
            claim.check_not_running()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        env = dict(os.environ)
        if self.spec.audit and urlparse(self.spec.checkpoint_uri).scheme == "s3":  # a directory is never away
            if left is None:  # an earlier run's records, before its master decides to resume or start afresh
                self._move_spooled()
            self._spool_dir.mkdir(exist_ok=True)
            (self._spool_dir / "store").write_text(self.spec.checkpoint_uri)  # where its records belong
            env[AUDIT_SPOOL_ENV] = str(self._spool_dir)
        resuming = bool(ckpts.committed())
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Each trainer an equal share of this machine's cores at the job's largest size: the frameworks'
        # own default (every core per process) oversubscribes them, PyTorch's by twice on two cores.
        env.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // self.spec.max_trainers)))
        cluster = LocalCluster(self.spec, self.dir, env, adopt=left)
        # The status from a long poll (``edl.launcher.watch``): the loop comes round ten times a second for
        # the trainers' exits, and asks the master only when something changed.
        launcher = Launcher(self.spec, cluster, max_trainer_failures=self.max_trainer_failures,
                            console=self.console, master_start_timeout_s=60.0, beat_in_background=True,
                            status_watch=StatusWatch(http_master))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _interrupt)
        stop_sidecar = threading.Event()
        try:
            launcher.start()
            say(self.console, (f"job {self.spec.job}", "bold"),
                f": master at {cluster.address}, trainers {self.spec.min_trainers}..{self.spec.max_trainers}, "
                f"logs in {self.dir / 'logs'}" + (
                    f" (adopted its running master and {len(left.trainers)} trainer(s))" if left is not None
                    else " (resuming from checkpoint)" if resuming else ""))
            if self.autoscale is not None:
                self._start_sidecar(cluster, self.autoscale, stop_sidecar)
                say(self.console, f"autoscale sidecar: {self.autoscale.slots} trainer slots on this machine, "
                                  f"policy {self.autoscale.policy}, every {self.autoscale.period_s:g} s")
            on_status = self.on_status
            view = (RecordingView(self.console, lambda st: self._record(st, on_status)) if on_status is not None
                    else ProgressView(self.console))
            with view:
                final = launcher.run(view)
                view.show(final)
            self._succeeded(launcher.finish(self.summary_out, self._audit if self.spec.audit else None))
            return 0
        finally:
            stop_sidecar.set()
            launcher.shutdown()

    def _record(self, st: JobView, on_status: Callable[[dict], None]) -> None:
        free = self.view.free_slots() if self.view is not None else None
        on_status({"t": time.time() - self.started_at, "world_size": st.world_size,
                        "desired": st.desired_trainers, "loss": st.loss, "free_slots": free,
                        "status": st.status.value})

    def _succeeded(self, result: JobResult) -> None:
        acc = f", held-out accuracy {result.metrics['accuracy']:.3f}" if "accuracy" in result.metrics else ""
        audit_txt = f", lost {result.lost_samples}, duplicated {result.duplicate_samples}" if self.spec.audit else ""
        say(self.console, (f"job {self.spec.job} succeeded", "green"),
            f": {result.epochs_completed} epochs, {result.steps} steps, "
            f"{result.throughput_samples_per_s:.0f} samples/s{acc}{audit_txt}; model at {result.final_model_uri}")

    @property
    def _spool_dir(self) -> Path:
        return self.dir / "audit-spool"

    def _move_spooled(self) -> None:
        """The audit records that trainers left in the job's directory while the store was away (those
        killed before it came back) go to the store they were written for, where the verdict reads them."""
        marker = self._spool_dir / "store"
        if not marker.is_file():
            return
        uri = marker.read_text().strip()
        try:
            moved = upload_spool(open_store(uri, "the audit spool's store"), audit_spool(self._spool_dir))
        except StorageError as e:
            raise StorageError(f"{e}; the job's audit records wait in {self._spool_dir}: run the same command "
                               "again once the store answers") from e
        if moved:
            say(self.console, f"audit: {moved} records the trainers kept in {self._spool_dir} while the store was "
                              "away moved to it")

    def _audit(self, summary: dict) -> None:
        self._move_spooled()
        audit_summary(self.spec, summary)


def hold_job(job: str, directory: Path) -> IO[str]:
    """The lock a launcher holds on its job's directory while it lives (released with its process, however
    it ends): a second ``edl train`` of the job on this machine is refused at once, and two relaunches of a
    killed one cannot both adopt its processes. Keep the file open: closing it releases the lock."""
    directory.mkdir(parents=True, exist_ok=True)
    f = (directory / "launcher.lock").open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise UserError(f"job {job!r} is already running on this machine: its edl train is pid {holder}; "
                        "wait for it to end or stop it") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _interrupt(signum: int, _frame) -> None:
    raise KeyboardInterrupt
