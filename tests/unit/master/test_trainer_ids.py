"""A trainer id is registered once: the master refuses it back after the trainer has gone, and its status
carries the highest number ending any id it registered, so a launcher that adopts the job (its books of
gone trainers are not in the status) never starts a trainer under an id the master would refuse."""

from __future__ import annotations

import pytest

from edl.api.data import Shard
from edl.api.spec import JobSpec
from edl.errors import UserError
from edl.master.job import Job, Timeouts


def test_a_gone_trainers_id_is_refused_back_and_counted_in_the_highest_number():
    spec = JobSpec(job="m", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=1, max_trainers=4,
                   trainers=2, checkpoint_uri="/tmp/x")
    job = Job(spec, [Shard("a.parquet", 4000)], master_uid="1", now=0.0, timeouts=Timeouts(prepare=False))
    assert job.status_view(0.0).highest_trainer_number == 0
    job.register("m-t2", 1, "h", 9000, now=0.0)
    job.register("m-t11", 2, "h", 9001, now=0.0)
    job.register("spare", 3, "h", 9002, now=0.0)  # an id without a number counts for nothing
    job.tick(0.1)
    job.trainer_exited("m-t11", 0, 1.0)
    view = job.status_view(1.0)
    assert "m-t11" not in {t.id for t in view.trainers}  # gone: not in the status
    assert view.highest_trainer_number == 11
    assert type(view).from_json(view.to_json()).highest_trainer_number == 11
    with pytest.raises(UserError, match="already"):
        job.register("m-t11", 4, "h", 9003, now=2.0)


def test_a_trainer_that_left_is_listed_as_departing_until_its_exit_is_reported():
    # What a launcher that adopts the job needs: which live processes or pods are leaving, not members.
    spec = JobSpec(job="m", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=1, max_trainers=4,
                   trainers=1, checkpoint_uri="/tmp/x")
    job = Job(spec, [Shard("a.parquet", 4000)], master_uid="1", now=0.0, timeouts=Timeouts(prepare=False))
    job.register("m-t1", 1, "h", 9000, now=0.0)
    job.tick(0.1)
    job.register("m-t2", 2, "h", 9001, now=0.2)  # waiting for the next generation
    job.drain("m-t2", 0.3)  # not in a generation yet: it leaves at once
    assert job.status_view(0.4).departing == ("m-t2",)
    job.trainer_exited("m-t2", 0, 0.5)
    assert job.status_view(0.6).departing == ()
    job.register("m-t3", 3, "h", 9002, now=0.7)
    job.trainer_exited("m-t3", 0, 0.8)  # left by ending, before any drain: its exit is the one reported
    assert job.status_view(0.9).departing == ()
    m = job.membership
    for i in range(100):  # exits never reported: the list keeps the newest
        m.register(f"x{i}", i, "h", 1, 1.0)
        m.drain(f"x{i}", 1.0)
    assert len(m.departing) == 64 and list(m.departing)[-1] == "x99"
