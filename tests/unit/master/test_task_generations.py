"""A trainer's task requests and cursors count only in the generation they were made in (``Job.next_task``,
``Job.heartbeat``): a request on the wire across a change must not hand out a task that the trainer's
new start never holds (lost rows) or that the master has taken back (rows trained twice)."""

from __future__ import annotations

from edl.api.data import Cursor, Shard, Task
from edl.api.master import Next, SyncReport
from edl.api.spec import JobSpec
from edl.master.job import Job, Timeouts


def started() -> Job:
    spec = JobSpec(job="gen", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=1, max_trainers=2,
                   trainers=1, checkpoint_uri="/tmp/x")
    job = Job(spec, [Shard("a.parquet", 80)], master_uid="7", now=0.0, timeouts=Timeouts(prepare=True))
    job.register("t0", 1, "h", 9000, now=0.0)
    job.tick(0.1)
    assert job.membership.current is not None and job.membership.current.id == 1
    return job


def test_a_request_of_another_generation_or_master_gets_nothing():
    job = started()
    assert job.next_task("t0", "r1", None, 1.0, master_uid="7", generation=2) is Next.WAIT
    assert job.next_task("t0", "r2", None, 1.0, master_uid="6", generation=1) is Next.WAIT
    assert job.queue.held_by("t0") == []
    task = job.next_task("t0", "r3", None, 1.0, master_uid="7", generation=1)
    assert isinstance(task, Task) and job.queue.held_by("t0") == [task]
    assert isinstance(job.next_task("t0", "r4", None, 1.0), Task)  # a request that names none: as before


def test_across_a_switch_each_side_is_answered_only_in_its_own_generation():
    job = started()
    first = job.next_task("t0", "r0", None, 1.0, master_uid="7", generation=1)
    assert isinstance(first, Task)
    job.heartbeat("t0", 3, None, 1.0, generation=1, store_port=9010)
    job.register("t1", 2, "h", 9001, now=1.1)
    job.tick(1.2)
    p = job.membership.prepared
    assert p is not None
    job.prepared_ready("t0", p.id, 1.3)
    job.prepared_ready("t1", p.id, 1.3)
    assert job.membership.go
    # t0 switched into the prepared generation at its step; the master adopts it once the report arrives.
    assert job.next_task("t0", "r1", None, 1.4, master_uid="7", generation=p.id) is Next.WAIT
    job.sync(SyncReport("t0", 1, 4, {"t0": Cursor(first.id, 4)}, 9010, switched_to=p.id), 1.5)
    assert job.membership.current.id == p.id
    held = job.assignment("t0").held  # what t0 learns at the change
    # A request t0 made before the change, answered after it: nothing, so the assignment's list is all it holds.
    assert job.next_task("t0", "r2", None, 1.6, master_uid="7", generation=1) is Next.WAIT
    assert tuple(job.queue.held_by("t0")) == held
    task = job.next_task("t0", "r3", None, 1.7, master_uid="7", generation=p.id)
    assert isinstance(task, Task) and job.queue.held_by("t0") == [*held, task]


def test_a_cursor_sent_before_a_change_commits_nothing_after_it():
    job = started()
    task = job.next_task("t0", "r0", None, 1.0, master_uid="7", generation=1)
    assert isinstance(task, Task)
    job.heartbeat("t0", 2, Cursor(task.id, 4), 1.1, generation=1)
    assert job.queue.held["t0"].offset == 4
    job.heartbeat("t0", 3, Cursor(task.id, 8), 1.2, generation=2)  # not the current generation
    assert job.queue.held["t0"].offset == 4
    job.heartbeat("t0", 3, Cursor(task.id, 8), 1.3, generation=1)
    assert job.queue.held["t0"].offset == 8


def test_a_request_asked_again_across_a_switch_gets_its_task_again():
    # t0's answer was lost on the wire; it asks again with the same id after switching into the prepared
    # generation (its buffer goes on), before the master adopted it, and again after. Answered WAIT, the
    # task would stay held by t0 in the master's count and never reach it: its rows lost.
    job = started()
    job.heartbeat("t0", 3, None, 1.0, generation=1, store_port=9010)
    lost = job.next_task("t0", "r1", None, 1.0, master_uid="7", generation=1)
    assert isinstance(lost, Task)
    job.register("t1", 2, "h", 9001, now=1.1)
    job.tick(1.2)
    p = job.membership.prepared
    job.prepared_ready("t0", p.id, 1.3)
    job.prepared_ready("t1", p.id, 1.3)
    assert job.next_task("t0", "r1", None, 1.4, master_uid="7", generation=p.id) == lost
    job.sync(SyncReport("t0", 1, 4, {"t0": None}, 9010, switched_to=p.id), 1.5)
    assert job.membership.current.id == p.id
    assert job.next_task("t0", "r1", None, 1.6, master_uid="7", generation=1) == lost
    assert job.queue.held_by("t0") == [lost]
