"""The transition tables of the master's state machines: what each allows, what each refuses."""

from __future__ import annotations

import pytest

from edl.api.master import JobStatus, Phase, Source, TrainerState
from edl.master.job import STATUS_TRANSITIONS
from edl.master.membership import PHASE_TRANSITIONS, TRAINER_TRANSITIONS, Membership, MembershipConfig, Trainer
from edl.master.transitions import IllegalTransition

PHASES_ALLOWED = {(Phase.FORMING, Phase.RUNNING), (Phase.RUNNING, Phase.SYNCING), (Phase.SYNCING, Phase.RUNNING)}
STATUS_ALLOWED = {(JobStatus.RUNNING, JobStatus.SUCCEEDED), (JobStatus.RUNNING, JobStatus.FAILED)}
W, A, D, L, F = (TrainerState.WAITING, TrainerState.ACTIVE, TrainerState.DRAINING, TrainerState.LEFT,
                 TrainerState.FAILED)
TRAINERS_ALLOWED = {(W, A), (W, F), (W, L), (A, D), (A, F), (A, L), (D, L), (D, F)}


@pytest.mark.parametrize("table, states, allowed", [
    (PHASE_TRANSITIONS, list(Phase), PHASES_ALLOWED),
    (STATUS_TRANSITIONS, list(JobStatus), STATUS_ALLOWED),
    (TRAINER_TRANSITIONS, list(TrainerState), TRAINERS_ALLOWED),
])
def test_each_table_allows_exactly_its_moves_and_refuses_every_other(table, states, allowed):
    for frm in states:
        for to in states:
            if (frm, to) in allowed:
                assert table.allows(frm, to) and table.move(frm, to) is to
            else:
                assert not table.allows(frm, to)
                with pytest.raises(IllegalTransition, match=f"{frm.value} -> {to.value} is not allowed"):
                    table.move(frm, to)


def test_membership_moves_through_forming_running_syncing_running():
    m = Membership(MembershipConfig(1, 2, desired=1, prepare=False))  # a change stops at a boundary
    assert m.phase is Phase.FORMING
    m.register("a", 1, "h", 1, now=0.0)
    assert m.phase is Phase.FORMING  # a registration before the first generation triggers nothing
    m.form(0.0, 0, Source.INIT)
    assert m.phase is Phase.RUNNING
    m.register("b", 2, "h", 2, now=1.0)
    assert m.phase is Phase.SYNCING
    with pytest.raises(IllegalTransition):  # a bug: forming while the generation still runs
        m._move(Phase.FORMING)


def test_a_trainer_that_left_cannot_come_back():
    t = Trainer("a", 1, "h", 1, 0.0, 0.0)
    t.move(TrainerState.ACTIVE)
    t.move(TrainerState.ACTIVE)  # staying is no move
    t.move(TrainerState.LEFT)
    with pytest.raises(IllegalTransition):
        t.move(TrainerState.ACTIVE)


def test_a_failed_job_stays_failed():
    from edl.api.data import Shard
    from edl.api.spec import JobSpec
    from edl.master.job import Job

    spec = JobSpec(job="j", model_def="m", data="d", epochs=1, batch_size=4, min_trainers=1, max_trainers=2,
                   trainers=1, checkpoint_uri="/tmp/x")
    job = Job(spec, [Shard("a.parquet", 40)], master_uid="1", now=0.0)
    job.fatal("loss is nan", 1.0)
    job.finish(5, None, {}, 2.0)  # a late finish is ignored, not a move out of FAILED
    assert job.status is JobStatus.FAILED and job.error == "loss is nan"
