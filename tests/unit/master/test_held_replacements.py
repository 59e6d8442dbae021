"""Trainers told to stop (preempted, deleted) are replaced only once the sidecar has decided again."""

from __future__ import annotations

from edl.api.cluster import SizeCause, SizeReason
from edl.api.data import Shard
from edl.api.spec import JobSpec
from edl.api.master import REPLACEMENT_HOLD_S as HOLD_S
from edl.master.job import Job, Timeouts

GROWING = SizeReason(SizeCause.GROWING, "room on n0")
HANDED_BACK = SizeReason(SizeCause.HANDED_BACK, "to web-0")


def started(trainers: int = 3) -> Job:
    spec = JobSpec(job="held", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=1, max_trainers=4,
                   trainers=trainers, checkpoint_uri="/tmp/x")
    job = Job(spec, [Shard("a.parquet", 4000)], master_uid="1", now=0.0, timeouts=Timeouts(prepare=True))
    for i in range(trainers):
        job.register(f"t{i}", i + 1, "h", 9000 + i, now=0.0)
    job.tick(0.1)
    assert job.membership.current is not None and job.membership.current.world_size == trainers
    return job


def test_the_replacements_of_trainers_told_to_stop_wait_for_the_sidecars_next_decision():
    job = started()
    job.scale(3, reason=GROWING, now=1.0)  # a sidecar sizes this job
    job.leave("t1", 2.0)
    job.leave("t2", 2.5)
    job.leave("t2", 2.7)  # asked again while it waits for the switch: still one trainer
    assert job.status_view(3.0).held_replacements == ("t1", "t2") and job.desired == 3
    # The sidecar's next decision, made on what it saw: the preemptor's pods leave room for one.
    job.scale(1, reason=HANDED_BACK, now=8.0, released=("t1", "t2"))
    view = job.status_view(8.1)
    assert view.held_replacements == () and view.desired_trainers == 1
    job.leave("t2", 8.5)  # its last ask, after the decision: not held again
    assert job.status_view(8.6).held_replacements == ()


def test_an_unchanged_size_from_the_sidecar_releases_them_too_and_a_silent_sidecar_does_after_a_while():
    job = started()
    job.scale(3, reason=GROWING, now=1.0)
    job.leave("t2", 2.0)
    before = job.control_key()
    assert job.status_view(2.0).held_replacements == ("t2",)
    job.leave("t1", 2.5)  # while the sidecar decided on a status without it
    job.scale(3, reason=GROWING, now=3.0, released=("t2",))  # room elsewhere: the same size, said again
    assert job.status_view(3.0).held_replacements == ("t1",) and job.control_key() != before  # the launcher wakes
    assert job.status_view(2.5 + HOLD_S).held_replacements == ("t1",)
    assert job.status_view(2.6 + HOLD_S).held_replacements == ()  # no decision came: replace it


def test_without_a_sidecar_a_trainer_told_to_stop_is_replaced_at_once():
    job = started()
    job.leave("t2", 2.0)
    assert job.status_view(2.0).held_replacements == ()
    job.scale(3, now=3.0)  # edl scale: by hand, no sidecar
    job.leave("t1", 4.0)
    assert job.status_view(4.0).held_replacements == ()


def test_a_trainer_the_launcher_drained_is_not_held_when_its_pod_is_deleted():
    job = started()
    job.scale(2, reason=HANDED_BACK, now=1.0)
    job.drain("t2", 1.5)  # the scale-down's drain; its pod is deleted after it left, or after the drain timeout
    job.leave("t2", 20.0)
    assert job.status_view(20.0).held_replacements == ()


def test_holds_come_back_after_an_expired_one():
    job = started()
    job.scale(3, reason=GROWING, now=1.0)
    job.leave("t2", 2.0)
    assert job.status_view(2.0 + 2 * HOLD_S).held_replacements == ()  # expired: the sidecar never decided
    job.leave("t1", 100.0)
    assert job.status_view(100.0).held_replacements == ("t1",)


def test_the_status_carries_the_held_trainers_through_json():
    from edl.api.master import JobView

    job = started()
    job.scale(3, reason=GROWING, now=1.0)
    job.leave("t1", 2.0)
    view = job.status_view(2.0)
    assert JobView.from_json(view.to_json()).held_replacements == ("t1",)


def test_a_trainer_preempted_before_it_joined_is_held_like_one_told_to_stop():
    """A pod preempted while its trainer started never asked to leave; its place is wanted all the same."""
    job = started(2)
    job.scale(4, reason=GROWING, now=1.0)
    job.register("t2", 3, "h", 9002, now=1.2)  # registered, waiting for the next generation
    job.trainer_exited("t2", 143, 2.0, preempted=True)
    job.trainer_exited("t3", 143, 2.0, preempted=True)  # never registered
    assert job.status_view(2.0).held_replacements == ("t2", "t3")
    job.scale(2, reason=HANDED_BACK, now=3.0, released=("t2", "t3"))
    assert job.status_view(3.0).held_replacements == ()


def test_a_member_preempted_or_an_exit_without_a_sidecar_holds_nothing():
    job = started(3)
    job.trainer_exited("t3", 143, 2.0, preempted=True)  # edl scale sizes this job: no decision to wait for
    assert job.status_view(2.0).held_replacements == ()
    job.scale(3, reason=GROWING, now=3.0)
    job.trainer_exited("t1", 137, 4.0, preempted=True)  # a member killed by force: re-formed, replaced at once
    job.trainer_exited("t4", 1, 4.0)  # a failure, not a preemption
    assert job.status_view(4.0).held_replacements == ()
