"""A master whose pod looks alive but that stops answering is replaced after a deadline; a replaced
master is reached where its successor answers."""

from __future__ import annotations

from rich.console import Console

from edl.api.cluster import MasterEndpoint
from edl.api.master import JobStatus
from edl.launcher.core import Launcher
from tests.clock import FakeClock
from tests.unit.launcher.test_api_away import SPEC, FlakyCluster, Master, launcher


class SilentMaster(Master):
    """Answers except while ``silent(t)``."""

    def __init__(self, clock: FakeClock, silent, **kw) -> None:
        super().__init__(clock, **kw)
        self.silent = silent

    def healthy(self) -> bool:
        return not self.silent(self.clock.t)

    def status(self):
        return None if self.silent(self.clock.t) else super().status()


class RecreatingCluster(FlakyCluster):
    def __init__(self, clock: FakeClock, master: SilentMaster) -> None:
        super().__init__(clock)
        self.master, self.recreated = master, []

    def recreate_master(self) -> str:
        self.recreated.append(self.clock.t)
        self.master.silent = lambda t: False  # the successor answers
        return "m:1"


def test_a_master_silent_past_the_limit_is_replaced_and_the_job_carries_on():
    clock = FakeClock(1000.0)
    master = SilentMaster(clock, silent=lambda t: t >= 1010, ends_at=1200)
    cluster = RecreatingCluster(clock, master)
    la, out = launcher(cluster, master, clock, master_silence_limit_s=60)
    clock.t = 1010.0
    assert la.run(poll_s=2.0).status is JobStatus.SUCCEEDED
    assert len(cluster.recreated) == 1 and 1070 < cluster.recreated[0] <= 1074
    assert la.master_restarts == 1 and "has not answered for over 60 s" in out.getvalue()


def test_a_master_silent_for_less_than_the_limit_is_kept():
    clock = FakeClock(1000.0)
    master = SilentMaster(clock, silent=lambda t: 1010 <= t < 1060, ends_at=1200)
    cluster = RecreatingCluster(clock, master)
    la, _ = launcher(cluster, master, clock, master_silence_limit_s=60)
    clock.t = 1010.0
    assert la.run(poll_s=2.0).status is JobStatus.SUCCEEDED
    assert cluster.recreated == [] and la.master_restarts == 0


class MovingCluster(FlakyCluster):
    """A master whose pod is lost at ``lost_at``; its successor answers at another address (pod-ip)."""

    def __init__(self, clock: FakeClock, lost_at: float) -> None:
        super().__init__(clock)
        self.lost_at, self.replaced = lost_at, False

    def ensure_job(self) -> MasterEndpoint:
        return MasterEndpoint("10.0.0.1:8470", "tok", False)

    def master_alive(self) -> bool:
        return self.replaced or self.clock.t < self.lost_at

    def recreate_master(self) -> str:
        self.replaced = True
        return "10.0.0.2:8470"


def test_a_replaced_master_is_reached_at_the_address_its_successor_answers_on():
    clock = FakeClock(1000.0)
    # The old address goes silent with its pod; only the successor's address answers.
    masters = {"10.0.0.1:8470": SilentMaster(clock, silent=lambda t: t >= 1010, ends_at=1100),
               "10.0.0.2:8470": SilentMaster(clock, silent=lambda t: False, ends_at=1100)}
    cluster = MovingCluster(clock, lost_at=1010)
    asked: list[str] = []

    def link(endpoint):
        asked.append(endpoint.address)
        return masters[endpoint.address]

    la = Launcher(SPEC, cluster, console=Console(quiet=True), clock=clock, sleep=clock.sleep, master_factory=link,
                  trainer_prefix="j-t", master_start_timeout_s=300)
    la.start()
    clock.t = 1010.0
    assert la.run(poll_s=2.0).status is JobStatus.SUCCEEDED
    assert asked == ["10.0.0.1:8470", "10.0.0.2:8470"] and la.master_restarts == 1
    assert masters["10.0.0.2:8470"].beats  # the successor hears the launcher's beats
