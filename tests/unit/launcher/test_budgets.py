"""Failure budgets that forgive progress: a job that keeps training is never failed by ordinary
disruptions, while a crash loop (a master that dies at start-up, the same crash at the same step)
still fails fast, naming why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edl.api.cluster import PodPhase, TrainerExit, TrainerPod
from edl.api.master import BudgetView, JobStatus
from edl.errors import PermanentError
from edl.launcher.budget import Budget, BudgetPolicy
from tests.clock import FakeClock
from tests.unit.launcher.test_api_away import FlakyCluster, Master, launcher


def test_failures_without_progress_exhaust_the_budget_one_past_its_limit():
    b = Budget(BudgetPolicy(limit=3))
    for _ in range(3):
        b = b.charge(10.0, step=7)
        assert not b.exhausted
    b = b.charge(10.0, step=7)
    assert b.exhausted and (b.spent, b.total, b.refunded) == (4, 4, 0)


def test_a_step_since_the_last_failure_refunds_the_budget():
    b = Budget(BudgetPolicy(limit=2))
    for step in range(100):  # a failure at every step: a long life of disruptions
        b = b.charge(float(step), step)
        assert not b.exhausted
    assert (b.spent, b.total, b.refunded) == (1, 100, 99)


def test_refund_steps_asks_for_more_progress():
    b = Budget(BudgetPolicy(limit=5, refund_steps=10))
    b = b.charge(0.0, 0).charge(1.0, 9)  # nine steps: not enough
    assert b.spent == 2
    assert b.charge(2.0, 19).spent == 1  # ten more since the last failure


def test_time_since_the_last_failure_refunds_it_as_kubernetes_forgets_a_back_off():
    b = Budget(BudgetPolicy(limit=1, forget_after_s=600)).charge(0.0, 0)
    assert b.charge(599.0, 0).spent == 2
    assert b.charge(600.0, 0).spent == 1


def test_back_off_doubles_between_failures_without_progress_and_is_capped():
    b = Budget(BudgetPolicy(limit=10, backoff_start_s=0.5, backoff_max_s=4.0))
    waits = []
    for _ in range(7):
        b = b.charge(0.0, 0)
        waits.append(b.backoff_s())
    assert waits == [0.0, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.charge(1.0, 5).backoff_s() == 0.0  # progress since: at once again


def test_what_a_budget_reports():
    b = Budget(BudgetPolicy(limit=10)).charge(0, 0).charge(1, 5).charge(2, 5)
    assert b.describe() == "2 of 10 without progress (3 in all, 1 forgiven)"
    assert b.to_json() == {"spent": 2, "limit": 10, "total": 3, "refunded": 1, "refund_steps": 1,
                           "forget_after_s": 600.0}


# ----------------------------------------------------------------- the launcher
class DyingMasterCluster(FlakyCluster):
    """The master's pod dies each time ``dies(t)`` says so; every successor starts."""

    def __init__(self, clock: FakeClock, master: "SteppingMaster") -> None:
        super().__init__(clock)
        self.master = master
        self.recreated: list[float] = []
        self.alive = True

    def master_alive(self) -> bool:
        return self.alive

    def recreate_master(self) -> str:
        self.recreated.append(self.clock.t)
        self.alive = True
        self.master.up = self.master.starts
        return "m:1"


class SteppingMaster(Master):
    """Trains one step a second while it is up; ``starts`` says whether a new one comes up at all."""

    def __init__(self, clock: FakeClock, starts: bool = True, **kw) -> None:
        super().__init__(clock, **kw)
        self.starts, self.up = starts, True

    def healthy(self) -> bool:
        return self.up

    def status(self):
        if not self.up:
            return None
        return replace(super().status(), step=int(self.clock.t))


def test_a_master_lost_over_and_over_while_the_job_trains_never_fails_the_job():
    clock = FakeClock(1000.0)
    master = SteppingMaster(clock, ends_at=1400)
    cluster = DyingMasterCluster(clock, master)
    la, out = launcher(cluster, master, clock, max_master_restarts=3)
    for _ in range(30):  # thirty relocations, training in between: ten times the limit
        for _ in range(3):
            clock.sleep(1.0)
            la.tick()
        cluster.alive = False
        master.up = False
        la.tick()
    assert len(cluster.recreated) == 30 and la.master_restarts == 30
    assert la.master_budget.spent == 1 and la.master_budget.refunded == 29
    assert "in 0.5 s" not in out.getvalue()  # no back-off: each restart followed progress


def test_a_master_that_dies_at_start_every_time_fails_the_job_within_a_minute_naming_why():
    clock = FakeClock(1000.0)
    master = SteppingMaster(clock, starts=False)
    cluster = DyingMasterCluster(clock, master)
    la, out = launcher(cluster, master, clock)  # the default limit: 10
    clock.sleep(1.0)
    la.tick()
    cluster.alive, master.up = False, False
    t0 = clock.t

    def dies_at_once() -> bool:
        return False

    cluster.master_alive = dies_at_once  # every successor's pod is gone again at once
    with pytest.raises(PermanentError, match=r"keeps dying: 11 restarts with no training step between them "
                                             r"\(limit 10\)"):
        for _ in range(100):
            la.tick()
    assert clock.t - t0 < 60
    assert "restart(s) since the last step" in out.getvalue()  # the back-off is said


class FailingTrainersCluster(FlakyCluster):
    """Every trainer pod fails (exit 1) as soon as the launcher looks."""

    def trainers(self) -> list[TrainerPod]:
        self._check()
        return [TrainerPod(n, PodPhase.FAILED, self.created_at, "node", exit=TrainerExit.FAILED, message="exit 1")
                for n in self.pods]


def test_trainers_failing_at_the_same_step_fail_the_job_but_not_while_it_trains():
    clock = FakeClock(1000.0)
    master = SteppingMaster(clock, desired=1)
    cluster = FailingTrainersCluster(clock)
    la, _ = launcher(cluster, master, clock, max_trainer_failures=2)
    for _ in range(20):  # a failure every few seconds, steps in between: forgiven
        clock.sleep(3.0)
        la.tick()
    assert la.failures >= 10 and not la.trainer_budget.exhausted
    master.status = lambda: replace(Master.status(master), step=5)  # stuck at one step from now on
    with pytest.raises(PermanentError, match=r"trainer failures with no training step between them \(limit 2\)"):
        for _ in range(20):
            clock.sleep(3.0)
            la.tick()


def test_the_summary_shows_the_budgets(tmp_path):
    clock = FakeClock(1000.0)
    master = SteppingMaster(clock, ends_at=1003)
    master.summary = lambda: {"job": "j", "status": JobStatus.SUCCEEDED.value}
    cluster = DyingMasterCluster(clock, master)
    la, _ = launcher(cluster, master, clock)
    result = la.run(poll_s=1.0)
    s = la.finish(tmp_path / "s.json")
    assert result.status is JobStatus.SUCCEEDED
    assert s.summary["budgets"]["master_restarts"]["limit"] == 10
    assert s.summary["budgets"]["trainer_failures"] == {"spent": 0, "limit": 5, "total": 0, "refunded": 0,
                                                        "refund_steps": 1, "forget_after_s": 600.0}


class AdoptedCluster(DyingMasterCluster):
    """A job a launcher before this one left running (killed, its command run again)."""

    def ensure_job(self):
        return replace(super().ensure_job(), adopted=True)


def test_an_adopting_launcher_carries_on_the_budgets_of_the_one_before_and_never_wipes_them():
    # The launcher before this one saw the master die three times at step 5 (limit 3) and was killed. Its
    # successor carries that on: one more death at the same step fails the job; its beats never report
    # fresh budgets in between (the master's copy is what the status and summary show).
    clock = FakeClock(1000.0)
    master = SteppingMaster(clock)
    left = {"master_restarts": BudgetView(3, 3, 9, 6), "trainer_failures": BudgetView(0, 5, 4, 4)}
    master.budgets = left
    master.status = lambda: replace(Master.status(master), step=5, budgets=master.budgets)
    cluster = AdoptedCluster(clock, master)
    la, _ = launcher(cluster, master, clock, max_master_restarts=3)
    assert (la.master_budget.spent, la.master_budget.total, la.trainer_budget.total, la.progress) == (3, 9, 4, 5)
    master.budgets = None
    la.beat()
    la.tick()
    assert master.budgets == {"master_restarts": BudgetView(3, 3, 9, 6), "trainer_failures": BudgetView(0, 5, 4, 4)}
    cluster.alive, master.up = False, False
    with pytest.raises(PermanentError, match=r"keeps dying: 4 restarts"):
        la.tick()


def test_a_launcher_that_starts_a_job_sends_its_budgets_from_the_first_beat():
    clock = FakeClock(1000.0)
    master = SteppingMaster(clock)
    la, _ = launcher(DyingMasterCluster(clock, master), master, clock)
    la.beat()
    assert master.budgets["master_restarts"] == BudgetView(0, 10, 0, 0)


def test_what_progress_forgave_is_shown_settled_and_not_carried_on_by_an_adopting_launcher():
    # Four trainer failures at step 100 (limit 5), then the job trained on to step 10,000: the beat reports
    # them forgiven, so a launcher that adopts the job then survives two failures at once.
    b = Budget(BudgetPolicy(limit=5))
    for _ in range(4):
        b = b.charge(10.0, 100)
    assert b.settled(20.0, 100).spent == 4  # no progress yet: still spent
    shown = b.settled(20.0, 10_000).view()
    assert shown == BudgetView(0, 5, 4, 4)
    carried = Budget(BudgetPolicy(limit=5)).carried_on(shown, 10_000, 30.0)
    assert not carried.charge(31.0, 10_000).charge(31.0, 10_000).exhausted
    assert b.settled(10.0 + 600, 100).spent == 0  # time forgives too
