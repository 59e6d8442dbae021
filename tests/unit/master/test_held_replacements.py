"""Trainers told to stop (preempted, deleted) are replaced only once the sidecar has decided again."""

from __future__ import annotations

from edl.api.cluster import SizeCause, SizeReason
from edl.api.data import Shard
from edl.api.spec import JobSpec
from edl.master.job import HOLD_S, Job, Timeouts

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
    assert job.status_view(3.0).held_replacements == 2 and job.desired == 3
    # The sidecar's next decision: the preemptor's pods leave room for one.
    job.scale(1, reason=HANDED_BACK, now=8.0)
    view = job.status_view(8.1)
    assert view.held_replacements == 0 and view.desired_trainers == 1


def test_an_unchanged_size_from_the_sidecar_releases_them_too_and_a_silent_sidecar_does_after_a_while():
    job = started()
    job.scale(3, reason=GROWING, now=1.0)
    job.leave("t2", 2.0)
    before = job.control_key()
    assert job.status_view(2.0).held_replacements == 1
    job.scale(3, reason=GROWING, now=9.0)  # room elsewhere: the same size, said again
    assert job.status_view(9.0).held_replacements == 0 and job.control_key() != before  # the launcher wakes
    job.leave("t1", 10.0)
    assert job.status_view(10.0 + HOLD_S).held_replacements == 1
    assert job.status_view(10.1 + HOLD_S).held_replacements == 0  # no decision came: replace it


def test_without_a_sidecar_a_trainer_told_to_stop_is_replaced_at_once():
    job = started()
    job.leave("t2", 2.0)
    assert job.status_view(2.0).held_replacements == 0
    job.scale(3, now=3.0)  # edl scale: by hand, no sidecar
    job.leave("t1", 4.0)
    assert job.status_view(4.0).held_replacements == 0
