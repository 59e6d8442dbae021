"""The trainer's pure decisions: how a generation starts, what each step ends in."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edl.api.data import Cursor
from edl.api.master import Source
from edl.trainer.decide import CheckpointWhy, StartPlan, StepContext, Then, decide_step, plan_start
from edl.trainer.slots import StepSums


def sums(samples=32, loss_sum=16.0, stop=False, finished=False, switch_to=0) -> StepSums:
    return StepSums({"a": Cursor(1, 16), "b": Cursor(2, 16)}, samples, loss_sum, stop, finished, switch_to)


def ctx(rank=0, step=10, first=False, since=0.0, interval=30.0, requested=False) -> StepContext:
    return StepContext(rank, step, first, since, interval, requested)


# ------------------------------------------------------------------ the start
def test_a_peer_generation_keeps_the_replica_and_its_data():
    for rank in (0, 1):
        for trained in (False, True):
            assert plan_start(Source.PEER, rank, 40, trained) == StartPlan(True, False, False, None)


def test_from_the_checkpoint_rank_0_loads_and_the_others_start_at_the_base_step():
    assert plan_start(Source.CHECKPOINT, 0, 40, False) == StartPlan(False, False, True, None)
    assert plan_start(Source.CHECKPOINT, 1, 40, False) == StartPlan(False, False, False, 40)


def test_a_rollback_rebuilds_a_replica_that_trained_since():
    assert plan_start(Source.CHECKPOINT, 0, 40, True).rebuild
    assert plan_start(Source.CHECKPOINT, 2, 40, True).rebuild
    assert plan_start(Source.INIT, 0, 0, True) == StartPlan(False, True, False, 0)
    assert plan_start(Source.INIT, 1, 0, False) == StartPlan(False, False, False, 0)


# ------------------------------------------------------------------ a step's end
def test_a_step_with_data_updates_and_goes_on():
    d = decide_step(sums(), ctx())
    assert d.then is Then.CONTINUE and d.update and not d.idle and not d.lead
    assert d.mean_loss == 0.5 and d.checkpoint is None and d.error is None


def test_a_step_without_data_changes_nothing_and_idles():
    d = decide_step(sums(samples=0, loss_sum=0.0), ctx())
    assert d.then is Then.CONTINUE and not d.update and d.idle and d.mean_loss is None


def test_any_stop_ends_the_generation_at_this_step():
    assert decide_step(sums(stop=True), ctx(rank=1)).then is Then.STOP
    d = decide_step(sums(samples=0, loss_sum=0.0, stop=True), ctx())
    assert d.then is Then.STOP and not d.lead


def test_every_rank_ready_for_a_prepared_generation_switches_unless_a_stop_or_the_end_comes_first():
    d = decide_step(sums(switch_to=7), ctx(rank=1))
    assert d.then is Then.SWITCH and d.update  # the step itself counts: the switch comes after it
    assert decide_step(sums(stop=True, switch_to=7), ctx()).then is Then.STOP
    assert decide_step(sums(samples=0, loss_sum=0.0, finished=True, switch_to=7), ctx()).then is Then.FINISH


def test_finished_wins_over_stop_and_rank_0_leads_the_end():
    d0 = decide_step(sums(samples=0, loss_sum=0.0, stop=True, finished=True), ctx(rank=0))
    d1 = decide_step(sums(samples=0, loss_sum=0.0, stop=True, finished=True), ctx(rank=1))
    assert d0.then is d1.then is Then.FINISH
    assert d0.lead and not d1.lead


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_loss_that_is_not_finite_aborts_the_job_before_any_update(bad):
    d = decide_step(sums(loss_sum=bad), ctx(step=6))
    assert d.then is Then.ABORT and not d.update and d.lead
    assert d.error == f"loss is {bad} at step 7; stopping the job"
    assert not decide_step(sums(loss_sum=bad), ctx(rank=1)).lead
    assert decide_step(sums(loss_sum=bad, finished=True, stop=True), ctx()).then is Then.ABORT


def test_the_first_step_is_reported_once_by_rank_0_when_someone_trained_or_all_finished():
    assert decide_step(sums(), ctx(first=True)).report_first_step
    assert decide_step(sums(samples=0, loss_sum=0.0, finished=True), ctx(first=True)).report_first_step
    assert not decide_step(sums(samples=0, loss_sum=0.0), ctx(first=True)).report_first_step
    assert not decide_step(sums(), ctx(first=False)).report_first_step
    assert not decide_step(sums(), ctx(rank=1, first=True)).report_first_step


def test_rank_0_checkpoints_when_the_interval_passed_or_the_master_asked():
    assert decide_step(sums(), ctx(since=30.0, interval=30.0)).checkpoint is CheckpointWhy.INTERVAL
    assert decide_step(sums(), ctx(since=29.9, interval=30.0)).checkpoint is None
    assert decide_step(sums(), ctx(since=1.0, requested=True)).checkpoint is CheckpointWhy.REQUESTED
    # The interval comes first: the request stays for the next step.
    assert decide_step(sums(), ctx(since=31.0, requested=True)).checkpoint is CheckpointWhy.INTERVAL
    assert decide_step(sums(samples=0, loss_sum=0.0, finished=True), ctx(since=99.0)).checkpoint is CheckpointWhy.INTERVAL
    assert decide_step(sums(), ctx(rank=1, since=99.0, requested=True)).checkpoint is None


@given(st.integers(0, 10_000), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.booleans(),
       st.integers(0, 7), st.booleans(), st.floats(0, 100), st.booleans())
def test_every_rank_reaches_the_same_end_and_only_rank_0_has_duties(samples, loss_sum, stop, finished, rank, first,
                                                                    since, requested):
    s = sums(samples, loss_sum, stop, finished)
    mine = decide_step(s, ctx(rank, 5, first, since, 30.0, requested))
    rank0 = decide_step(s, ctx(0, 5, first, since, 30.0, requested))
    assert mine.then is rank0.then and mine.update == rank0.update
    if rank != 0:
        assert not (mine.lead or mine.report_first_step or mine.checkpoint)
    assert mine.update == (samples > 0 and mine.then is not Then.ABORT)
