"""``edl master``: validate the job, restore from the newest checkpoint, serve the API."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import replace
from typing import NamedTuple

import uvicorn

from edl.api.data import Shard
from edl.api.spec import JobSpec
from edl.data.dataset import Dataset, resolve_splits
from edl.errors import UserError
from edl.master.job import Job, Timeouts
from edl.master.server import Master, build_app
from edl.storage.audit import clear_audit
from edl.storage.checkpoint import FINAL, WARM_START_FILE, CheckpointStore
from edl.storage.claim import Holder, PrefixClaim
from edl.storage.store import open_store

log = logging.getLogger("edl.master")


class PreparedJob(NamedTuple):
    """A job checked against its data and storage, with what the checks found."""

    spec: JobSpec  # data and eval_data resolved to the files read (passed on as they are: to the master's argv)
    shards: list[Shard]
    checkpoints: CheckpointStore
    claim: PrefixClaim  # the prefix's owner record and run lock


def prepare_job(spec: JobSpec) -> PreparedJob:
    """Checks that fail fast with a ``UserError``: data set, checkpoint store."""
    data, held_out = resolve_splits(spec.data)
    spec = replace(spec, data=data, eval_data=spec.eval_data or held_out)
    shards = Dataset(spec.data).shards()
    if spec.eval_data:
        Dataset(spec.eval_data, "--eval-data").shards()
    if spec.init_model:
        init = open_store(spec.init_model, "--init-model")
        if not init.exists(WARM_START_FILE):
            raise UserError(f"--init-model {spec.init_model!r}: no {WARM_START_FILE} there (expected a model "
                            "directory written by edl, e.g. a previous run's CHECKPOINT_URI/model)")
    store = open_store(spec.checkpoint_uri, "--checkpoint-uri")
    store.check()
    claim = PrefixClaim(store, spec)
    claim.check_owner()  # before anything is written there
    return PreparedJob(spec, shards, CheckpointStore(store, spec.keep_checkpoints), claim)


def timeouts_from_env() -> Timeouts:
    """The trainer timeouts, from EDL_LEASE_S and EDL_SYNC_TIMEOUT_S (bench/throughput.py stretches the lease)."""
    return Timeouts(lease_s=float(os.environ.get("EDL_LEASE_S", Timeouts.lease_s)),
                    sync_timeout_s=float(os.environ.get("EDL_SYNC_TIMEOUT_S", Timeouts.sync_timeout_s)))


def restore(ckpts: CheckpointStore) -> tuple[dict | None, str | None]:
    found = ckpts.latest(warn=log.warning)
    if found is None:
        return None, None
    ckpt, files = found
    state = json.loads(files["master.json"])
    log.info("resuming from %s (step %d)", ckpt.uri, ckpt.step)
    return state, ckpt.uri


async def serve(master: Master, host: str, port: int) -> None:
    config = uvicorn.Config(build_app(master), host=host, port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    ticker = asyncio.create_task(master.ticker())

    async def watch_shutdown() -> None:
        await master.shutdown_requested.wait()
        server.should_exit = True

    watcher = asyncio.create_task(watch_shutdown())
    try:
        await server.serve()
    finally:
        ticker.cancel()
        watcher.cancel()


def run_master(spec: JobSpec, host: str, port: int, token: str) -> int:
    spec, shards, ckpts, claim = prepare_job(spec)
    # One live run per job; the holder id is the same for its restarts.
    restarted = claim.acquire(Holder.of_this_process(token))
    try:
        return _serve_job(spec, shards, ckpts, claim, host, port, token, restarted)
    finally:
        claim.release()


def _lost_lock() -> None:
    # Another run took the prefix over (this one looked dead to it): stop writing there at once.
    log.error("the run lock was taken over by another run; stopping this master")
    os._exit(1)


def _serve_job(spec: JobSpec, shards: list[Shard], ckpts: CheckpointStore, claim: PrefixClaim, host: str,
               port: int, token: str, restarted: bool = False) -> int:
    claim.keep_renewing(_lost_lock)
    state, uri = restore(ckpts)
    if state is None and spec.audit and not restarted:
        # A start from scratch: the records of an earlier start are not this run's. A restarted master's
        # are: its trainers go on from where they stopped.
        clear_audit(ckpts.store)
    # The job's clock measures durations only (membership, timeouts, the dead-man switch): monotonic,
    # so a wall-clock step (NTP) neither trips the switch nor drops trainers.
    job = Job(spec, shards, master_uid=str(time.time_ns()), now=time.monotonic(), restored=state, restored_uri=uri,
              timeouts=timeouts_from_env())
    if job.queue.finished:
        # Every epoch was already trained: report the recorded outcome instead of training again.
        final = json.loads(ckpts.store.get(FINAL)) if ckpts.store.exists(FINAL) else {}
        job.finish(int(final.get("step", job.restore_step)), final.get("final_model_uri"), final.get("metrics", {}),
                   time.monotonic())
        log.info("job %s was already complete at step %d", spec.job, job.final_step)
    master = Master(job, token, clock=time.monotonic)
    log.info(
        "master for job %s on %s:%d: %d shards, %d rows per epoch, %d epochs, trainers %d..%d (desired %d)",
        spec.job, host, port, len(shards), job.queue.rows_per_epoch, spec.epochs,
        spec.min_trainers, spec.max_trainers, job.desired,
    )
    claim.wait_fenced()  # a predecessor of this run that may live on has stopped by now (after the work above)
    asyncio.run(serve(master, host, port))
    return 0
