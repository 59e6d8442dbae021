"""A job checked against its data and storage before anything runs: the checks that fail fast.

``edl train`` runs them before it starts the master (``edl.launcher.local``), and ``edl master``
runs them itself (``edl.master.main``), so one place says what a job needs of its data set, its
warm start and its checkpoint prefix.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from edl.api.data import Shard
from edl.api.spec import JobSpec
from edl.data.splits import resolve_splits
from edl.errors import UserError
from edl.storage.checkpoint import WARM_START_FILE, CheckpointStore
from edl.storage.claim import PrefixClaim
from edl.storage.store import open_store


class PreparedJob(NamedTuple):
    """A job checked against its data and storage, with what the checks found."""

    spec: JobSpec  # data and eval_data resolved to the files read (passed on as they are: to the master's argv)
    shards: list[Shard]
    checkpoints: CheckpointStore
    claim: PrefixClaim  # the prefix's owner record and run lock


def prepare_job(spec: JobSpec) -> PreparedJob:
    """Checks that fail fast with a ``UserError``: data set, checkpoint store."""
    spec = resolve_data(spec)
    shards = check_data(spec)
    ckpts, claim = open_checkpoints(spec)
    return PreparedJob(spec, shards, ckpts, claim)


def resolve_data(spec: JobSpec) -> JobSpec:
    """``data`` and ``eval_data`` as the files read (one listing: ``edl.data.splits``)."""
    data, held_out = resolve_splits(spec.data)
    return replace(spec, data=data, eval_data=spec.eval_data or held_out)


def check_data(spec: JobSpec) -> list[Shard]:
    """The training shards (every footer read), the held-out set and the warm start checked."""
    # Imported here: a restarted master goes on from its checkpoint's queue and needs no Parquet reader.
    from edl.data.dataset import Dataset

    shards = Dataset(spec.data).shards()
    if spec.eval_data:
        Dataset(spec.eval_data, "--eval-data").shards()
    if spec.init_model:
        init = open_store(spec.init_model, "--init-model")
        if not init.exists(WARM_START_FILE):
            raise UserError(f"--init-model {spec.init_model!r}: no {WARM_START_FILE} there (expected a model "
                            "directory written by edl, e.g. a previous run's CHECKPOINT_URI/model)")
    return shards


def open_checkpoints(spec: JobSpec) -> tuple[CheckpointStore, PrefixClaim]:
    store = open_store(spec.checkpoint_uri, "--checkpoint-uri")
    store.check()
    claim = PrefixClaim(store, spec)
    claim.check_owner()  # before anything is written there
    return CheckpointStore(store, spec.keep_checkpoints), claim
