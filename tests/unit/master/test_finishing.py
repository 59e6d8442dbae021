"""The job's last step: what may still form once the data is all done (``Job.tick``)."""

from __future__ import annotations

from edl.api.data import Cursor, Shard, Task
from edl.api.master import SyncReport
from edl.api.spec import JobSpec
from edl.master.job import Job, Timeouts


def spec() -> JobSpec:
    return JobSpec(job="fin", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=1, max_trainers=2,
                   trainers=1, checkpoint_uri="/tmp/x")


def started() -> Job:
    job = Job(spec(), [Shard("a.parquet", 40)], master_uid="1", now=0.0, timeouts=Timeouts(prepare=True))
    job.register("t0", 1, "h", 9000, now=0.0)
    job.tick(0.1)
    assert job.membership.current is not None and job.membership.current.id == 1
    return job


def take_everything(job: Job, now: float) -> Cursor:
    tasks = []
    while isinstance(t := job.next_task("t0", f"r{len(tasks)}", None, now), Task):
        tasks.append(t)
    last = tasks[-1]
    return Cursor(last.id, last.end - last.start)


def test_a_switch_at_the_step_that_finished_the_data_is_still_adopted():
    # A joiner's prepared generation got the go, and the members switched into it at the very step whose
    # cursors finish the data. The trainers train in generation 2 from there (its rank 0 cuts the last
    # checkpoint and ends the job in it), so the master must form it: before, it formed nothing once the
    # queue was finished, and rank 0's checkpoints were refused as stale for ever (the job never ended).
    job = started()
    job.heartbeat("t0", 3, None, 1.0, generation=1, store_port=9010)  # where rank 0's next store listens
    job.register("t1", 2, "h", 9001, now=1.1)
    job.tick(1.2)
    p = job.membership.prepared
    assert p is not None and p.members == ("t0", "t1")
    job.prepared_ready("t0", p.id, 1.3)
    job.prepared_ready("t1", p.id, 1.3)
    assert job.membership.go
    end = take_everything(job, 1.4)
    job.heartbeat("t0", 9, end, 1.5, generation=1)  # the last step's cursor: the data is all done
    assert job.queue.finished
    job.sync(SyncReport("t0", 1, 10, {"t0": end}, 9010, switched_to=p.id), 1.6)
    assert job.membership.current.id == p.id and job.membership.current.members == ("t0", "t1")
    assert job.heartbeat_answer("t1").generation == p.id


def test_nothing_else_forms_once_the_data_is_done():
    # A trainer that stopped on its own (no switch) while the data is done: the job is finishing, no
    # generation forms (rank 0 writes the last checkpoint in the current one).
    job = started()
    end = take_everything(job, 1.0)
    job.heartbeat("t0", 9, end, 1.5, generation=1)
    assert job.queue.finished
    job.register("t1", 2, "h", 9001, now=1.6)
    job.sync(SyncReport("t0", 1, 10, {"t0": end}, 9010), 1.7)
    assert job.tick(2.0) is None and job.membership.current.id == 1


def test_a_trainer_already_dropped_that_exits_after_the_data_is_done_changes_nothing():
    # Its exit reaches the master after it was declared failed (silent too long): it neither leaves nor
    # fails a second time (before, the move failed -> left raised and the launcher's report got a 500).
    job = started()
    job.launcher_beat(99.0)
    job.tick(100.0)  # t0 silent past its lease: failed
    assert job.membership.trainers["t0"].state.value == "failed"
    job.queue.done_rows = {0: job.queue.rows_per_epoch}
    assert job.queue.finished
    job.trainer_exited("t0", 0, 101.0)
    assert job.membership.trainers["t0"].state.value == "failed"
