"""A trainer told to stop while the job is at its minimum trains on until its replacement has joined,
then leaves as a drained trainer does: the model never has nobody to hold it (no restart from the
checkpoint), and the launcher starts the replacement at once instead of after the trainer's exit."""

from __future__ import annotations

from edl.api.cluster import PodPhase, TrainerPod
from edl.api.data import Cursor, Shard
from edl.api.master import JobView, Phase, Reason, Source, SyncReport, TrainerState
from edl.api.spec import JobSpec
from edl.launcher.reconcile import plan_trainers
from edl.master.job import Job, Timeouts


def started(trainers: int, min_trainers: int) -> Job:
    spec = JobSpec(job="m", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=min_trainers,
                   max_trainers=4, trainers=trainers, checkpoint_uri="/tmp/x")
    job = Job(spec, [Shard("a.parquet", 4000)], master_uid="1", now=0.0, timeouts=Timeouts(prepare=False))
    for i in range(trainers):
        job.register(f"t{i}", i + 1, "h", 9000 + i, now=0.0)
    job.tick(0.1)
    return job


def report_all(job: Job, step: int, now: float) -> None:
    m = job.membership
    for t in m.members():
        if m.trainers[t].state in (TrainerState.ACTIVE, TrainerState.DRAINING):
            job.sync(SyncReport(t, m.current.id, step, {t: Cursor(1, 2)}, 7000, False), now)


def test_the_only_trainer_told_to_stop_trains_on_until_its_replacement_joined_then_leaves():
    job = started(1, min_trainers=1)
    m = job.membership
    assert job.leave("t0", 1.0) and not job.leave("t0", 1.5)  # asked again while it waits: nothing new
    assert job.status_view(1.5).replacing == ("t0",)
    job.tick(1.6)
    assert m.phase is Phase.RUNNING and m.trainers["t0"].state is TrainerState.ACTIVE  # no stop: it trains on
    job.register("t1", 2, "h", 9001, now=3.0)  # the replacement
    job.tick(3.0)
    report_all(job, 40, 3.1)  # (each report ticks the job: the last one forms)
    g = m.current
    assert g.members == ("t0", "t1") and g.reason is Reason.SCALE_UP and g.source is Source.PEER
    job.tick(3.2)  # it has joined: t0 is drained now
    assert m.trainers["t0"].state is TrainerState.DRAINING and m.phase is Phase.SYNCING
    report_all(job, 41, 3.3)
    g = m.current
    assert g.members == ("t1",) and g.reason is Reason.SCALE_DOWN and g.source is Source.PEER
    assert g.rolled_back_steps == 0 and g.base_step == 41
    assert m.trainers["t0"].state is TrainerState.LEFT
    job.tick(3.4)
    # Listed until its exit is reported: the launcher must not count its process as one trainer too many.
    assert job.status_view(3.4).replacing == ("t0",)
    job.trainer_exited("t0", 0, 3.5)
    assert job.status_view(3.5).replacing == ()
    assert [h.reason for h in m.history] == [Reason.START, Reason.SCALE_UP, Reason.SCALE_DOWN]


def test_above_the_minimum_a_trainer_told_to_stop_is_drained_at_once():
    job = started(2, min_trainers=1)
    assert job.leave("t1", 1.0)
    assert job.membership.trainers["t1"].state is TrainerState.DRAINING and job.status_view(1.0).replacing == ()


def test_the_launcher_starts_the_replacement_at_once_and_never_drains_it_as_excess():
    t0 = TrainerPod("t0", PodPhase.RUNNING, 0.0, "n0")
    plan = plan_trainers(1, [t0], {}, 1.0, 120.0, replacing=("t0",))
    assert plan.create == 1 and plan.drain == () and plan.delete == ()
    t1 = TrainerPod("t1", PodPhase.RUNNING, 2.0, "n0")
    plan = plan_trainers(1, [t0, t1], {}, 3.0, 120.0, replacing=("t0",))
    assert plan.create == 0 and plan.drain == () and plan.delete == ()
    # It left (exit 0) as a drained trainer does: not a trainer that left on its own, not a failure.
    from edl.api.cluster import TrainerExit
    gone = TrainerPod("t0", PodPhase.SUCCEEDED, 0.0, "n0", TrainerExit.SUCCEEDED)
    plan = plan_trainers(1, [gone, t1], {}, 5.0, 120.0, replacing=("t0",))
    assert plan.create == 0 and plan.failures == () and plan.delete == ("t0",)


def test_the_status_carries_them_through_json():
    job = started(1, min_trainers=1)
    job.leave("t0", 1.0)
    assert JobView.from_json(job.status_view(1.0).to_json()).replacing == ("t0",)
