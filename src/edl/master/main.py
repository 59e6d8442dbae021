"""``edl master``: validate the job, restore from the newest checkpoint, serve the API."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path

import uvicorn

from edl.api.data import Shard
from edl.api.master import JobStatus, JobView
from edl.api.spec import JobSpec
from edl.jobcheck import check_data, open_checkpoints, resolve_data
from edl.master.job import Job, Timeouts
from edl.master.server import Master, build_app, standby_app
from edl.storage.audit import clear_audit
from edl.storage.checkpoint import FINAL, CheckpointStore, name_of
from edl.storage.claim import Holder, PrefixClaim

log = logging.getLogger("edl.master")


def timeouts_from_env() -> Timeouts:
    """The trainer timeouts, from EDL_LEASE_S and EDL_SYNC_TIMEOUT_S (bench/throughput.py stretches the lease),
    and EDL_PREPARED_CHANGES=0, which makes graceful changes stop at a boundary instead of switching into a
    prepared generation (bench/recovery.py runs both)."""
    return Timeouts(lease_s=float(os.environ.get("EDL_LEASE_S", Timeouts.lease_s)),
                    sync_timeout_s=float(os.environ.get("EDL_SYNC_TIMEOUT_S", Timeouts.sync_timeout_s)),
                    prepare=os.environ.get("EDL_PREPARED_CHANGES", "1") != "0")


def restore(ckpts: CheckpointStore) -> tuple[dict | None, str | None]:
    found = ckpts.latest(warn=log.warning)
    if found is None:
        return None, None
    ckpt, files = found
    state = json.loads(files["master.json"])
    log.info("resuming from %s (step %d)", ckpt.uri, ckpt.step)
    return state, ckpt.uri


def still_newest(ckpts: CheckpointStore, uri: str | None) -> bool:
    """Whether the checkpoint at ``uri`` (``None``: none) is still the newest committed one (one listing)."""
    names = ckpts.committed()
    if uri is None:
        return not names
    return bool(names) and name_of(uri) == names[-1]


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: ``/proc``), to 10 ms; None where that cannot be read."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class StartUp:
    """How long each part of the master's start took (its log's "master up" line: what a restart costs).
    From the process's start, or from ``woken_at``: a spare master told to start (its imports done before)."""

    def __init__(self, woken_at: float | None = None) -> None:
        self.since = "the standby was woken" if woken_at is not None else "the process started"
        self.marks: list[tuple[str, float]] = []
        age = process_age_s()
        if woken_at is not None:
            self.began = woken_at
        else:
            self.began = time.monotonic() - (age or 0.0)  # the process's start, where known
            if age is not None:
                self.marks.append(("imports", time.monotonic()))

    def mark(self, part: str) -> None:
        self.marks.append((part, time.monotonic()))

    def line(self, now: float) -> str:
        parts, before = [], self.began
        for part, t in self.marks:
            parts.append(f"{part} {t - before:.3f} s")
            before = t
        return ", ".join(parts) + f"; listening at {now - self.began:.3f} s since {self.since}"


async def serve(master: Master, host: str, port: int, startup: StartUp | None = None) -> None:
    # No websockets and no lifespan protocol: nothing to load for them at the start.
    config = uvicorn.Config(build_app(master), host=host, port=port, log_level="warning", access_log=False,
                            ws="none", lifespan="off")
    server = uvicorn.Server(config)
    ticker = asyncio.create_task(master.ticker())

    async def report_startup() -> None:
        while not server.started:
            await asyncio.sleep(0.005)
        if startup is not None:
            log.info("master up: %s", startup.line(time.monotonic()))

    reporter = asyncio.create_task(report_startup())

    async def watch_shutdown() -> None:
        await master.shutdown_requested.wait()
        server.should_exit = True

    watcher = asyncio.create_task(watch_shutdown())
    try:
        await server.serve()
    finally:
        ticker.cancel()
        watcher.cancel()
        reporter.cancel()


class _Stopped(Exception):
    """SIGTERM: this master is stopped (its pod deleted, or its launcher ends the job)."""


def _raise_stopped(_signum: int, _frame: object) -> None:
    raise _Stopped


def run_master(spec: JobSpec, host: str, port: int, token: str, woken_at: float | None = None,
               await_handover_s: float = 0.0) -> int:
    """Serve the job until it ends (0) or this process is stopped (SIGTERM: 143, as the signal's own exit).
    ``await_handover_s``: a spare woken as its predecessor stops (its pod deleted) waits up to this long for
    it to hand the run lock over, which spares the fence."""
    # SIGTERM unwinds the master (while it serves, uvicorn stops first and raises the signal again once
    # stopped), so that the run lock is handed over on the way out: the successor need not fence it.
    signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        _run_master(spec, host, port, token, woken_at, await_handover_s)
    except _Stopped:
        log.info("master for job %s stopped (SIGTERM)", spec.job)
        return 128 + signal.SIGTERM
    return 0


def _run_master(spec: JobSpec, host: str, port: int, token: str, woken_at: float | None,
                await_handover_s: float) -> None:
    startup = StartUp(woken_at)
    holder = Holder.of_this_process(token)  # the holder id is the same for every master of one run
    spec = resolve_data(spec)
    ckpts, claim = open_checkpoints(spec)
    if await_handover_s > 0:
        claim.await_handover(holder, await_handover_s)
        startup.mark("handover")
    restored: tuple[dict | None, str | None] | None = None
    shards: list[Shard] = []
    if claim.held_by(holder.id):
        # A restart within the run (its master died): the data were checked when it started, and the
        # checkpoint's queue is all it needs of them. Back sooner, for the trainers waiting on it.
        restored = restore(ckpts)
        startup.mark("checkpoint")
    if restored is None or restored[0] is None:
        shards = check_data(spec)
        startup.mark("checks")
    # One live run per job.
    restarted = claim.acquire(holder)
    status: JobStatus | None = None
    try:
        claim.keep_renewing(_lost_lock)
        startup.mark("lock")
        if claim.predecessor is not None:
            # A predecessor of this run may live on (a lost node's processes run until fenced), and so may its
            # rank 0, committing checkpoints and pruning older ones: the one read above may be gone by the
            # time the trainers load it. Choose the checkpoint once the predecessor has stopped.
            claim.wait_fenced()
            if restored is not None and not still_newest(ckpts, restored[1]):
                restored = restore(ckpts)
                if restored[0] is None and not shards:
                    shards = check_data(spec)
            startup.mark("fence")
        status = _serve_job(spec, shards, ckpts, claim, host, port, token, restarted, startup, restored)
    finally:
        # Stopped while the job runs (its pod deleted: SIGTERM): the lock goes to the next master of the run.
        claim.release(handover=status in (None, JobStatus.RUNNING))


# A spare master asks its job's master how the job is this often: only to give up once the job is over (the
# launcher stops it then anyway); its wake-up comes on stdin at once, whatever this is. Each ask is a full
# status, which once a second cost the spare and the master about 3 ms of CPU a second beside the trainers.
STANDBY_POLL_S = 5.0


def standby_done(view: JobView | None, unanswered_s: float, launcher_timeout_s: float) -> bool:
    """Whether a spare master can give up waiting: its job is over or abandoned by its launcher (the
    master says so), or the master has not answered for twice the launcher's timeout: a launcher that
    wakes its spare within a poll of the master's death is not there."""
    if view is not None:
        return view.abandoned or view.status is not JobStatus.RUNNING
    return unanswered_s > 2 * launcher_timeout_s


class _JobWatch:
    """A spare master's look at its job through the serving master at ``address``, once a poll."""

    def __init__(self, spec: JobSpec, address: str, token: str) -> None:
        from edl.masterlink import HttpMaster

        self.spec = spec
        self.link = HttpMaster(address, token, timeout_s=2.0, give_up_s=0.0)
        self.answered = time.monotonic()

    def spare_not_needed(self) -> bool:
        """Ask once; ``standby_done`` (logged when so)."""
        view = self.link.status()
        if view is not None:
            self.answered = time.monotonic()
        if standby_done(view, time.monotonic() - self.answered, self.spec.launcher_timeout_s):
            log.info("standby master for job %s: not needed (the job is over, or its launcher is gone)",
                     self.spec.job)
            return True
        return False


def wait_as_standby(spec: JobSpec, host: str, port: int, token: str) -> bool:
    """A spare master's wait (``edl master --standby``): ``True`` once told to start (a line on stdin),
    ``False`` when it never will be (stdin closed, or ``standby_done``)."""
    job = _JobWatch(spec, f"{host}:{port}", token)
    log.info("standby master for job %s: ready, waiting to be woken", spec.job)
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], STANDBY_POLL_S)
        if ready:
            return bool(sys.stdin.readline())
        if job.spare_not_needed():
            return False


def wait_as_standby_pod(spec: JobSpec, host: str, port: int, token: str, serving: str | None = None) -> float | None:
    """A spare master pod's wait (``edl master --standby http``): it serves ``standby_app`` at its own
    address until the launcher wakes it; answers how long to wait for the predecessor's lock then, or
    ``None`` when it will not be needed: stopped (its pod deleted), or, asking the ``serving`` master every
    ``STANDBY_POLL_S``, the job is over or abandoned by its launcher (``standby_done``: a spare whose
    launcher died ends with its job)."""
    woken: list[float] = []
    done = threading.Event()
    server: uvicorn.Server | None = None

    def wake(await_handover_s: float) -> None:
        woken.append(await_handover_s)
        assert server is not None
        server.should_exit = True

    def watch(address: str) -> None:
        job = _JobWatch(spec, address, token)
        while not done.wait(STANDBY_POLL_S):
            if not woken and job.spare_not_needed():
                assert server is not None
                server.should_exit = True
                return

    config = uvicorn.Config(standby_app(token, wake), host=host, port=port, log_level="warning",
                            access_log=False, ws="none", lifespan="off")
    server = uvicorn.Server(config)
    if serving:
        threading.Thread(target=watch, args=(serving,), name="edl-standby-watch", daemon=True).start()
    log.info("standby master for job %s: ready at %s:%d, waiting to be woken", spec.job, host, port)
    try:
        asyncio.run(server.serve())
    finally:
        done.set()
    return woken[0] if woken else None


def _lost_lock() -> None:
    # Another run took the prefix over (this one looked dead to it): stop writing there at once.
    log.error("the run lock was taken over by another run; stopping this master")
    os._exit(1)


def _serve_job(spec: JobSpec, shards: list[Shard], ckpts: CheckpointStore, claim: PrefixClaim, host: str,
               port: int, token: str, restarted: bool = False, startup: StartUp | None = None,
               restored: tuple[dict | None, str | None] | None = None) -> JobStatus:
    """Serve until the server stops; the job's status then (``RUNNING``: this master was stopped)."""
    startup = startup or StartUp()
    if restored is None:
        restored = restore(ckpts)
        startup.mark("checkpoint")
    state, uri = restored
    if state is None and spec.audit and not restarted:
        # A start from scratch: the records of an earlier start are not this run's. A restarted master's
        # are: its trainers go on from where they stopped.
        clear_audit(ckpts.store)
    # The job's clock measures durations only (membership, timeouts, the dead-man switch): monotonic,
    # so a wall-clock step (NTP) neither trips the switch nor drops trainers.
    job = Job(spec, shards, master_uid=str(time.time_ns()), now=time.monotonic(), restored=state, restored_uri=uri,
              wall_offset=time.time() - time.monotonic(),
              timeouts=timeouts_from_env())
    if job.queue.finished:
        # Every epoch was already trained: report the recorded outcome instead of training again.
        final = json.loads(ckpts.store.get(FINAL)) if ckpts.store.exists(FINAL) else {}
        job.finish(int(final.get("step", job.restore_step)), final.get("final_model_uri"), final.get("metrics", {}),
                   time.monotonic())
        log.info("job %s was already complete at step %d", spec.job, job.final_step)
    master = Master(job, token, clock=time.monotonic)
    startup.mark("job")
    log.info(
        "master for job %s on %s:%d: %d shards, %d rows per epoch, %d epochs, trainers %d..%d (desired %d)",
        spec.job, host, port, len(job.queue.shards), job.queue.rows_per_epoch, spec.epochs,
        spec.min_trainers, spec.max_trainers, job.desired,
    )
    tune_collector()
    asyncio.run(serve(master, host, port, startup))
    return job.status


# Objects allocated between two collections of the youngest generation (CPython's default is 700).
YOUNG_COLLECTION_EVERY = 10_000


def tune_collector() -> None:
    """The cyclic garbage collector, for a server of long polls. A heartbeat waits up to a second on the
    master, and what its request allocated lives as long: with collections every 700 allocations it
    outlived two of them and was promoted to the oldest generation, whose collections then came every
    second or two at 1,024 trainers and held the event loop for 100-150 ms each (every call waited
    behind them). Collected every 10,000 allocations, requests die young."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, middle, oldest)
