"""A trainer whose master stays unreachable ends itself; one told the job is abandoned stops."""

from __future__ import annotations

from edl.api.master import HeartbeatAnswer, JobStatus, TrainerState
from edl.errors import TemporaryError
from edl.trainer.heartbeat import Control, Heartbeat, master_lost, master_lost_after_s
from edl.trainer.progress import Progress
from tests.clock import FakeClock




class Link:
    """Answers until ``down_at``, then the master is unreachable."""

    def __init__(self, clock: FakeClock, down_at: float) -> None:
        self.clock, self.down_at = clock, down_at

    def heartbeat(self, trainer: str, **kw) -> HeartbeatAnswer:
        self.clock.t += 1.0  # a long poll
        if self.clock.t >= self.down_at:
            raise TemporaryError("master at http://m unreachable: ConnectError")
        return HeartbeatAnswer("1", True, TrainerState.ACTIVE, 1, False, JobStatus.RUNNING, False)


def test_the_rule_and_its_limit():
    assert not master_lost(100.0, 160.0, 60.0) and master_lost(100.0, 160.1, 60.0)
    assert master_lost_after_s(30.0) == 60.0 and master_lost_after_s(45.0) == 90.0


def test_a_trainer_ends_itself_once_the_master_has_not_answered_for_the_limit():
    clock = FakeClock()
    lost: list[float] = []
    hb = Heartbeat(Link(clock, down_at=10.0), "t1", Progress(), Control("1"), on_stuck=lambda: None, clock=clock,
                   sleep=clock.sleep, on_master_lost=lambda: lost.append(clock.t), master_lost_s=60.0)
    while not lost and clock.t < 200:
        hb.beat()
    assert lost and 9.0 + 60.0 < lost[0] <= 9.0 + 62.0  # the last answer came at t=9


def test_an_abandoned_answer_stops_the_generation_at_the_next_step():
    control = Control("1")
    assert not control.stops(1)
    control.learn(HeartbeatAnswer("1", True, TrainerState.ACTIVE, 1, True, JobStatus.RUNNING, False, abandoned=True))
    assert control.stops(1) and control.stops(2)  # whatever generation it is in


def test_answers_of_a_stale_master_that_still_knows_us_are_ignored_a_restarted_one_is_not():
    """A lost node's old master lives on beside its successor, and a kept-alive connection may still
    reach it: after joining the new master, one late answer from the old one must not stop every
    generation to come (it did: 'generation N: 2 -> 2 trainers (resume)' without end)."""
    control = Control()
    control.reset("new")
    stale = HeartbeatAnswer("old", True, TrainerState.ACTIVE, 7, True, JobStatus.FAILED, True, abandoned=True)
    control.learn(stale)
    assert not control.stops(3) and not control.checkpoint_requested  # nothing it says is ours
    control.learn(HeartbeatAnswer("new", True, TrainerState.ACTIVE, 3, False, JobStatus.RUNNING, False))
    assert not control.stops(3)
    control.learn(HeartbeatAnswer("newer", False, None, 0, False, JobStatus.RUNNING, False))  # ours restarted
    assert control.stops(3)
    control.reset("newer")  # joined it afresh
    assert not control.stops(1)
