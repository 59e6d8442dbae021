"""The launcher over a cluster whose API goes away for a while: the plan is held, nothing is
created or deleted, and it carries on when the API is back; trainer names are never reused and
pending time is counted from first sight on the launcher's own clock."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from rich.console import Console

from edl.api.cluster import MasterEndpoint, PodPhase, SizeCause, SizeReason, TrainerPod
from edl.api.master import GenerationSummary, JobStatus, JobView, Phase, Reason, Source, TrainerState, TrainerView
from edl.api.spec import JobSpec
from edl.errors import KubeForbiddenError, KubeUnavailableError, PermanentError
from edl.launcher.core import Launcher
from tests.clock import FakeClock

SPEC = JobSpec(job="j", model_def="m", data="d", epochs=1, batch_size=1, min_trainers=1, max_trainers=4,
               trainers=2, checkpoint_uri="c")




class FlakyCluster:
    """Trainer pods in memory; every call raises ``KubeUnavailableError`` while ``away(t)``, then
    ``KubeForbiddenError`` while ``forbidden(t)``."""

    def __init__(self, clock: FakeClock, away=lambda t: False, created_at: float = 0.0, forbidden=lambda t: False) -> None:
        self.clock, self.away, self.created_at, self.forbidden = clock, away, created_at, forbidden
        self.pods: dict[str, PodPhase] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []

    def _check(self) -> None:
        if self.away(self.clock.t):
            raise KubeUnavailableError("Kubernetes API unreachable: list pods 'edl.dev/job=j': connection refused")
        if self.forbidden(self.clock.t):
            raise KubeForbiddenError("Kubernetes API refused to list pods 'edl.dev/job=j': HTTP 403 Forbidden")

    def ensure_job(self) -> MasterEndpoint:
        self._check()
        return MasterEndpoint("m:1", "tok", False)

    def master_alive(self) -> bool:
        self._check()
        return True

    def recreate_master(self) -> str:
        raise AssertionError("the master was not lost")

    def trainers(self) -> list[TrainerPod]:
        self._check()
        return [TrainerPod(n, p, self.created_at, None if p is PodPhase.PENDING else "node") for n, p in self.pods.items()]

    def create_trainer(self, name: str, node: str | None = None) -> None:
        self._check()
        self.pods[name] = PodPhase.RUNNING
        self.created.append(name)

    def delete_trainer(self, name: str) -> None:
        self._check()
        self.pods.pop(name, None)
        self.deleted.append(name)

    def delete_job(self) -> None:
        self.pods.clear()

    def record(self, reason: str, message: str, warning: bool = False) -> None:
        pass


def view(desired: int, status: JobStatus = JobStatus.RUNNING, trainers: tuple[str, ...] = ()) -> JobView:
    return JobView(job="j", status=status, error=None, master_uid="1", phase=Phase.RUNNING, generation=1,
                   world_size=desired, desired_trainers=desired, unschedulable_at=None, min_trainers=1,
                   max_trainers=4, epoch=0, epochs=1, epochs_completed=0, rows_per_epoch=0, done_rows=(0,), step=0,
                   loss=None, generations=(), checkpoints=(), elapsed_s=0.0,
                   trainers=tuple(TrainerView(t, 0, 1, TrainerState.ACTIVE, 0) for t in trainers))


class Master:
    """Wants ``desired`` trainers; the job ends at ``ends_at``."""

    def __init__(self, clock: FakeClock, desired: int = 2, ends_at: float = float("inf")) -> None:
        self.clock, self.desired, self.ends_at = clock, desired, ends_at
        self.known: tuple[str, ...] = ()
        self.beats: list[float] = []  # when the launcher said it is alive (the dead-man switch)

    def launcher_beat(self, budgets=None) -> None:
        self.beats.append(self.clock.t)
        self.budgets = budgets

    def healthy(self) -> bool:
        return True

    def status(self) -> JobView:
        done = self.clock.t >= self.ends_at
        return view(self.desired, JobStatus.SUCCEEDED if done else JobStatus.RUNNING, self.known)

    def drain(self, name: str) -> bool:
        return False

    def report_exit(self, name: str, code: int, preempted: bool = False) -> None:
        pass

    def report_unschedulable(self, n: int) -> None:
        pass


def launcher(cluster: FlakyCluster, master: Master, clock: FakeClock, **kw) -> tuple[Launcher, io.StringIO]:
    out = io.StringIO()
    la = Launcher(SPEC, cluster, console=Console(file=out, width=200), clock=clock, sleep=clock.sleep,
                  master_factory=lambda endpoint: master, trainer_prefix="j-t", **kw)
    la.start()
    return la, out


def test_the_plan_is_held_while_the_api_is_away_and_the_job_carries_on_when_it_is_back():
    clock = FakeClock(1000.0)
    cluster = FlakyCluster(clock, away=lambda t: 1010 <= t < 1030)
    master = Master(clock, desired=2, ends_at=1060)
    la, out = launcher(cluster, master, clock)
    for _ in range(4):
        la.tick()
    assert cluster.created == ["j-t1", "j-t2"]
    clock.t = 1009.0
    # While away the master wants 4, then 1: nothing may be created or deleted until the API is back.
    master.desired = 4
    final = la.run(poll_s=2.0)
    assert final.status is JobStatus.SUCCEEDED
    assert cluster.created == ["j-t1", "j-t2", "j-t3", "j-t4"] and not cluster.deleted
    lines = out.getvalue().splitlines()
    away = [ln for ln in lines if "API away" in ln]
    back = [ln for ln in lines if "API back" in ln]
    assert len(away) == 1 and "connection refused" in away[0] and "holding the plan" in away[0]
    assert len(back) == 1 and "after 20 s" in back[0]


def test_an_apiserver_just_back_that_refuses_until_its_rbac_caches_fill_is_still_away():
    clock = FakeClock(1000.0)
    cluster = FlakyCluster(clock, away=lambda t: 1010 <= t < 1030, forbidden=lambda t: 1030 <= t < 1034)
    la, out = launcher(cluster, Master(clock, ends_at=1060), clock)
    clock.t = 1009.0
    assert la.run(poll_s=2.0).status is JobStatus.SUCCEEDED
    assert out.getvalue().count("API away") == 1 and "after 2" in out.getvalue()
    # Refused without an outage before it: a real RBAC problem, the job fails at once.
    clock = FakeClock(1000.0)
    la, _ = launcher(FlakyCluster(clock, forbidden=lambda t: t >= 1010), Master(clock), clock)
    clock.t = 1010.0
    with pytest.raises(KubeForbiddenError, match="403"):
        la.run(poll_s=2.0)


def test_an_api_away_past_its_limit_fails_the_job():
    clock = FakeClock(1000.0)
    cluster = FlakyCluster(clock, away=lambda t: t >= 1010)
    la, _ = launcher(cluster, Master(clock), clock, api_away_limit_s=60)
    clock.t = 1010.0
    with pytest.raises(PermanentError, match="cluster API away for over 60 s"):
        la.run(poll_s=2.0)
    assert clock.t < 1010 + 70


def test_trainer_names_are_never_reused_after_a_scale_down_and_a_new_launcher():
    clock = FakeClock(1000.0)
    cluster = FlakyCluster(clock)
    master = Master(clock, desired=3)
    la, _ = launcher(cluster, master, clock)
    la.tick()
    assert cluster.created == ["j-t1", "j-t2", "j-t3"]
    # Scaled down: j-t3 left and its pod is gone, but the master still has it in its books.
    del cluster.pods["j-t3"]
    master.known, master.desired = ("j-t1", "j-t2", "j-t3"), 2
    la.tick()
    # A new launcher (a retried step) adopts the job, then the master wants 3 again.
    la2, _ = launcher(cluster, master, clock)
    master.desired = 3
    la2.tick()
    assert cluster.created[3:] == ["j-t4"]


def test_pending_time_counts_from_first_sight_on_the_launcher_s_clock():
    clock = FakeClock(1000.0)
    # The apiserver's clock is an hour ahead... or behind: its creationTimestamp is not used.
    for skewed in (clock.t - 3600, clock.t + 3600):
        cluster = FlakyCluster(clock, created_at=skewed)
        cluster.pods["j-t1"] = PodPhase.PENDING
        la, _ = launcher(cluster, Master(clock, desired=1), clock, pending_timeout_s=120)
        la.tick()
        assert not cluster.deleted and la.unschedulable == 0  # an hour "old" by the apiserver: not stuck
        clock.t += 119
        la.tick()
        assert la.unschedulable == 0
        clock.t += 2
        la.tick()
        assert cluster.deleted == ["j-t1"] and la.unschedulable == 1


def test_the_launcher_beats_the_master_every_round_even_while_the_api_is_away():
    """The dead-man switch must not trip while the launcher lives: it reaches the master without the API."""
    clock = FakeClock(1000.0)
    master = Master(clock, desired=2, ends_at=1060)
    la, _ = launcher(FlakyCluster(clock, away=lambda t: 1010 <= t < 1040), master, clock)
    la.run(poll_s=2.0)
    assert master.beats and master.beats[-1] >= 1058
    gaps = [b - a for a, b in zip([1000.0, *master.beats], master.beats)]
    assert max(gaps) <= 2.0, gaps  # one beat per 2 s round, the API away from 1010 to 1040 included
    assert set(master.budgets) == {"master_restarts", "trainer_failures"}  # each beat carries them for the status
    assert master.budgets["master_restarts"].limit == la.master_budget.policy.limit


def test_each_change_of_why_the_job_is_at_its_size_is_one_event_on_the_launcher():
    clock = FakeClock(1000.0)
    cluster = FlakyCluster(clock)
    events: list[tuple[str, str]] = []
    cluster.record = lambda reason, message, warning=False: events.append((reason, message))  # type: ignore[method-assign]
    master = Master(clock, desired=2)
    said = iter([None, SizeReason(SizeCause.NO_ROOM, "full"), SizeReason(SizeCause.NO_ROOM, "still full"),
                 SizeReason(SizeCause.HANDED_BACK, "to web-0"), SizeReason(SizeCause.HANDED_BACK, "to web-0")])
    base = master.status
    master.status = lambda: replace(base(), reason=next(said))  # type: ignore[method-assign]
    la, _ = launcher(cluster, master, clock)
    for _ in range(4):
        la.tick()
    assert [e for e in events if e[0].startswith("Size")] == [("SizeNoRoom", "full"), ("SizeHandedBack", "to web-0")]


def generation(gid: int, first_step_at: float | None, cause: str = "j-t2 joined") -> GenerationSummary:
    return GenerationSummary(gid, gid, 2, ("j-t1", "j-t2"), Reason.SCALE_UP, Source.PEER, 10 * gid, None,
                             triggered_at=100.0 * gid, first_step_at=first_step_at, rolled_back_steps=0,
                             stopped_at=100.0 * gid + 0.1, formed_at=100.0 * gid + 0.4, cause=cause)


def test_each_generation_is_one_event_with_its_chain_once_it_has_stepped_and_an_adopted_jobs_are_not_told_again():
    clock = FakeClock(1000.0)
    cluster = FlakyCluster(clock)
    events: list[tuple[str, str]] = []
    cluster.record = lambda reason, message, warning=False: events.append((reason, message))  # type: ignore[method-assign]
    master = Master(clock)
    gens = [generation(1, 100.5)]  # the job was adopted: generation 1 is the launcher's before this one
    base = master.status
    master.status = lambda: replace(base(), generations=tuple(gens))  # type: ignore[method-assign]
    la, _ = launcher(cluster, master, clock)
    la.tick()
    gens.append(generation(2, None))  # formed, not stepped yet
    la.tick()
    gens[1] = generation(2, 201.25)
    la.tick()
    la.tick()
    started = [m for r, m in events if r == "GenerationStarted"]
    assert started == ["generation 2 (scale_up, 2 trainers): j-t2 joined; stopped +0.10 s, formed +0.40 s, "
                       "first step +1.25 s"]
