"""The trainer's generation loop against fakes: a scripted master, a framework that counts, real data.

``Trainer`` takes its parts from its caller, so the loop runs here in-process with no sockets and no
framework: the master hands out one generation and the data set's tasks, the replica records what
it was given, the group sums a world of one (or fails where told). What the loop reports, steps and
writes is then checked against what the job must see.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edl.api.data import Cursor, Task
from edl.api.master import (
    NO_STATE,
    Assignment,
    HeartbeatAnswer,
    JobStatus,
    Next,
    NoAssignment,
    Prepared,
    Registration,
    Source,
    SyncReport,
    TrainerState,
    Unassigned,
)
from edl.api.spec import JobSpec
from edl.data.dataset import Dataset
from edl.data.prepare import prepare_synthetic
from edl.errors import Abandoned, CollectiveError
from edl.modeldef import ModelDef
from edl.storage.checkpoint import FINAL
from edl.storage.store import open_store
from edl.trainer.worker import EXIT_FAILED, EXIT_OK, Links, Trainer
from edl.zoo.collate import collate

pytestmark = pytest.mark.timeout(60)

ROWS, BATCH = 120, 8


class FakeMaster:
    """A master for one trainer: one generation of world 1, the tasks in order, then the end."""

    def __init__(self, tasks: list[Task], end: JobStatus = JobStatus.SUCCEEDED) -> None:
        self.tasks = list(tasks)
        self.end = end
        self.assigned = False
        self.syncs: list[SyncReport] = []
        self.first_steps: list[int] = []
        self.finished: tuple[int, str | None, dict] | None = None
        self.cuts: list[int] = []
        self.lock = threading.Lock()

    def register(self, trainer, pid, host, store_port, resume=None) -> Registration:
        return Registration("11", JobStatus.RUNNING)

    def assignment(self, trainer, after, wait_s):
        with self.lock:
            if not self.assigned:
                self.assigned = True
                return Assignment(1, 0, 1, (trainer,), ("127.0.0.1", 1), 0, Source.INIT, None, None, (), 0, "11")
            return NoAssignment(Unassigned.FINISHED, self.end if self.finished is None else JobStatus.SUCCEEDED)

    def heartbeat(self, trainer, **kw) -> HeartbeatAnswer:
        return HeartbeatAnswer("11", True, TrainerState.ACTIVE, 1, False, JobStatus.RUNNING, False)

    def next_task(self, trainer, request_id, safe_cursor, *, master_uid=None, generation=None):
        with self.lock:
            return self.tasks.pop(0) if self.tasks else Next.FINISHED

    def sync(self, report: SyncReport) -> None:
        self.syncs.append(report)

    def first_step(self, trainer, generation) -> None:
        self.first_steps.append(generation)

    def checkpoint_cut(self, generation, step, cursors) -> dict:
        self.cuts.append(step)
        return {"queue": []}

    def checkpoint_committed(self, generation, step, uri, write_s) -> bool:
        return True

    def finish(self, step, final_model_uri, metrics) -> None:
        self.finished = (step, final_model_uri, metrics)

    def prepared_ready(self, trainer, generation) -> None:
        raise AssertionError("no prepared generation in these scripts")

    def task_failed(self, trainer, task_id, reason) -> None:
        raise AssertionError(f"task {task_id} failed: {reason}")

    def fail_job(self, message, user=False) -> None:
        raise AssertionError(message)


@dataclass
class FakeGroup:
    rank: int = 0
    world: int = 1
    fail: bool = False  # the next all-reduce raises, as when a peer died

    def all_reduce_sum(self, t: Any) -> None:
        if self.fail:
            raise CollectiveError("all-reduce failed: Connection closed by peer")

    def broadcast(self, t: Any, src: int = 0) -> None:
        pass

    def abandon(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class FakeReplica:
    """Counts rows and steps; its only parameter holds the number of steps applied."""

    batches: list[np.ndarray] = field(default_factory=list)  # the ``x`` of every backward
    applied: list[int] = field(default_factory=list)  # samples per end_step
    dropped: int = 0
    trained: bool = False
    steps: int = 0
    fail_at_batch: int | None = None  # the all-reduce of this batch (counting from 1) fails
    abort_at_batch: int | None = None  # the generation is aborted while this batch's backward runs
    abort: Any = None  # what begin_step was given to ask

    def build(self) -> None:
        pass

    def warm_up(self, x, y) -> None:
        pass

    def backward(self, x, y) -> float:
        self.batches.append(x)
        if len(self.batches) == self.abort_at_batch and self.abort is not None and self.abort():
            raise Abandoned("the generation was aborted during backward")  # as an interruptible backward does
        return float(len(y))

    def begin_step(self, group, slots, submit, abort=None) -> None:
        self.abort = abort

    def reduce_rest(self, group, slots, submit) -> Future:
        group.fail = len(self.batches) == self.fail_at_batch  # this step's batch is that one

        def last() -> np.ndarray:
            group.all_reduce_sum(slots)
            return slots  # a world of one: the sum is its own slots

        return submit(last)

    def end_step(self, samples: int) -> None:
        if self.fail_at_batch == len(self.batches):
            self.fail_at_batch = None  # an idle step after the batch must not fail again
        self.applied.append(samples)
        if samples:
            self.steps += 1
            self.trained = True

    def drop_grads(self) -> None:
        self.dropped += 1

    def broadcast(self, group, step) -> int:
        return step

    def snapshot(self):
        return {"w": np.array([self.steps], np.float32)}, {}, {}

    def restore(self, params, opt_arrays, extra) -> None:
        self.steps = int(params["w"][0])

    def parameters(self):
        return {"w": np.array([self.steps], np.float32)}

    def set_parameters(self, params) -> None:
        self.steps = int(params["w"][0])

    def export(self, out: Path) -> str | None:
        (out / "model.onnx").write_bytes(b"onnx")
        return None

    def evaluate(self, x, y):
        return 0.5, np.zeros((len(y), 2), np.float32)


@dataclass
class FakeFramework:
    replica_: FakeReplica
    group_: FakeGroup
    name: str = "fake"

    def replica(self, md, seed, learning_rate, init_params, bucket_bytes=None, first_bytes=None) -> FakeReplica:
        return self.replica_

    def group(self, host, port, rank, world, group_id, backend, timeout_s=10) -> FakeGroup:
        return self.group_


def _trainer(tmp_path: Path, master: FakeMaster, fail_at_batch: int | None = None, abort_at_batch: int | None = None
             ) -> tuple[Trainer, FakeReplica, list[int]]:
    data = tmp_path / "data"
    prepare_synthetic(str(data), ROWS + ROWS // 9, 4, 2, shards=1)  # a tenth held out: ROWS for training
    spec = JobSpec("loop", "fake", str(data / "train"), 1, BATCH, 1, 1, 1, str(tmp_path / "ckpt"),
                   eval_data=str(data / "test"), checkpoint_interval_s=1e9)
    md = ModelDef("fake", None, lambda: None, lambda o, y: None, lambda p, lr: None, collate, None)  # type: ignore[arg-type]
    replica = FakeReplica(fail_at_batch=fail_at_batch, abort_at_batch=abort_at_batch)
    exits: list[int] = []
    links = Links(master, master, master, master, master, master, master, lambda: master)  # type: ignore[arg-type]
    trainer = Trainer("t1", "127.0.0.1", spec, md, FakeFramework(replica, FakeGroup()), links,  # type: ignore[arg-type]
                      Dataset(spec.data), open_store(spec.checkpoint_uri), exit_process=exits.append)
    return trainer, replica, exits


def _tasks(dataset: Dataset) -> list[Task]:
    (shard,) = dataset.shards()
    assert shard.rows == ROWS
    return [Task(i, 0, shard.name, start, min(start + 2 * BATCH, shard.rows))
            for i, start in enumerate(range(0, shard.rows, 2 * BATCH))]


def test_one_generation_trains_every_row_once_then_finishes_with_the_model(tmp_path):
    master = FakeMaster([])
    trainer, replica, exits = _trainer(tmp_path, master)
    master.tasks = _tasks(trainer.dataset)
    assert trainer.run() == EXIT_OK
    rows = np.concatenate(replica.batches)
    assert len(rows) == ROWS  # every row once
    assert len(np.unique(rows, axis=0)) == ROWS
    assert sum(replica.applied) == ROWS and replica.steps == ROWS // BATCH
    assert master.first_steps == [1]  # the generation's first step ends its pause
    step, uri, metrics = master.finished
    assert step == ROWS // BATCH and uri.endswith("/model")
    assert metrics["loss"] == 0.5 and 0 <= metrics["accuracy"] <= 1  # the held-out evaluation ran
    store = open_store(str(tmp_path / "ckpt"))
    assert store.exists("model/model.onnx") and store.exists("model/params.npz") and store.exists(FINAL)
    assert master.cuts == [ROWS // BATCH]  # the last checkpoint, at the last step
    assert exits == []


def test_a_failed_all_reduce_drops_the_step_and_reports_where_it_stopped(tmp_path):
    master = FakeMaster([], end=JobStatus.FAILED)
    trainer, replica, exits = _trainer(tmp_path, master, fail_at_batch=4)
    master.tasks = _tasks(trainer.dataset)
    assert trainer.run() == EXIT_FAILED  # the fake master ends the job after the failure
    assert replica.steps == 3 and [n for n in replica.applied if n] == [BATCH] * 3  # the fourth was not applied
    assert replica.dropped == 1  # its partial sums were dropped
    (report,) = master.syncs
    assert report.failed and report.generation == 1 and report.step == 3
    assert report.cursors == {"t1": Cursor(1, BATCH)}  # 3 batches of 8 in tasks of 16: task 1, 8 rows in
    assert master.finished is None


def test_a_generation_aborted_during_backward_stops_the_step_there_and_reports_where_it_stopped(tmp_path):
    master = FakeMaster([], end=JobStatus.FAILED)
    trainer, replica, exits = _trainer(tmp_path, master, abort_at_batch=4)
    master.tasks = _tasks(trainer.dataset)
    aborted = trainer.control.aborts
    trainer.control.aborts = lambda gen: len(replica.batches) >= 4 or aborted(gen)  # type: ignore[method-assign]
    assert trainer.run() == EXIT_FAILED
    assert replica.steps == 3 and replica.dropped == 1  # the fourth step left mid-backward, its sums dropped
    (report,) = master.syncs
    assert report.failed and report.step == 3 and report.cursors == {"t1": Cursor(1, BATCH)}


class CheckpointedGeneration(FakeMaster):
    """A restarted master's generation from its checkpoint (base step 40), this trainer rank 1 of 2."""

    def assignment(self, trainer, after, wait_s):
        with self.lock:
            if not self.assigned:
                self.assigned = True
                return Assignment(1, 1, 2, ("t0", trainer), ("127.0.0.1", 1), 40, Source.CHECKPOINT, "ckpt", None,
                                  (), 0, "11", (1,))
            return NoAssignment(Unassigned.FINISHED, JobStatus.FAILED)


class NoGroup(FakeFramework):
    def group(self, host, port, rank, world, group_id, backend, timeout_s=10):
        raise CollectiveError("a peer died while the group formed")


def test_a_generation_that_fails_before_its_state_arrives_is_reported_without_a_state(tmp_path):
    # The replica still holds what it trained under the old master (step 77): not the generation's state,
    # so the report must not offer it as the next generation's source (it would be trained on twice).
    master = CheckpointedGeneration([])
    trainer, replica, _ = _trainer(tmp_path, master)
    trainer.framework = NoGroup(replica, FakeGroup())
    trainer.progress.step = 77
    assert trainer.run() == EXIT_FAILED
    (report,) = master.syncs
    assert report.failed and report.generation == 1 and report.step == NO_STATE


class RestartedAfterADroppedPreparation(FakeMaster):
    """The trainer could not join prepared generation 4 (the master dropped it); then the master restarts
    (it no longer knows the trainer) and its first generation is 1."""

    def __init__(self, tasks: list[Task]) -> None:
        super().__init__(tasks, end=JobStatus.FAILED)
        self.asked: list[int] = []
        self.registrations = 0

    def register(self, trainer, pid, host, store_port, resume=None) -> Registration:
        self.registrations += 1
        return Registration(str(10 + self.registrations), JobStatus.RUNNING)

    def assignment(self, trainer, after, wait_s):
        with self.lock:
            self.asked.append(after)
            if len(self.asked) == 1:
                return Prepared(4, ("t0", trainer), ("127.0.0.1", 1), (1,), False)
            if self.registrations == 1:
                return NoAssignment(Unassigned.UNKNOWN)
            if after < 1:  # the new master's generation 1 is newer than what this trainer has seen of it
                return NoAssignment(Unassigned.FINISHED, JobStatus.SUCCEEDED)
            return NoAssignment(Unassigned.FINISHED, JobStatus.FAILED)  # it would have waited on for ever


def test_a_trainer_re_registered_with_a_restarted_master_takes_its_first_generation(tmp_path):
    # The soak's 25-s stall: a trainer that once passed over a dropped prepared generation (4) kept asking
    # for generations after 4 from the restarted master, whose first is 1: it never formed its group, its
    # peers gave up on it and the master dropped it after 15 s.
    master = RestartedAfterADroppedPreparation([])
    trainer, _, _ = _trainer(tmp_path, master)
    trainer._join_prepared = lambda prepared: None  # type: ignore[method-assign]
    assert trainer.run() == EXIT_OK
    assert master.asked == [0, 4, 0]


class RestartedWhileJoining(RestartedAfterADroppedPreparation):
    """The trainer joins prepared generation 4 and tells the master its group formed; then the master
    restarts (its heartbeats come from another master that does not know the trainer): no go ever comes."""

    def __init__(self, tasks: list[Task]) -> None:
        super().__init__(tasks)
        self.ready: list[int] = []

    def prepared_ready(self, trainer, generation) -> None:
        self.ready.append(generation)

    def heartbeat(self, trainer, **kw) -> HeartbeatAnswer:
        if self.ready:
            return HeartbeatAnswer("99", False, None, 0, False, JobStatus.RUNNING, False)
        return HeartbeatAnswer("11", True, TrainerState.WAITING, 0, False, JobStatus.RUNNING, False)


def test_a_joiner_whose_master_restarted_while_it_waited_for_the_go_re_registers_at_once(tmp_path, monkeypatch):
    # It waited for the go until its own limit (30 s) before: here there is none, so only noticing the
    # restart ends the wait (the test's timeout otherwise).
    monkeypatch.setattr("edl.trainer.worker.PREPARED_WAIT_S", 1e9)
    master = RestartedWhileJoining([])
    trainer, _, _ = _trainer(tmp_path, master)
    assert trainer.run() == EXIT_OK
    assert master.ready == [4] and master.registrations == 2 and master.asked == [0, 4, 0]
