"""A master whose pod looks alive but that stops answering is replaced after a deadline."""

from __future__ import annotations

from edl.api.master import JobStatus
from tests.clock import FakeClock
from tests.unit.launcher.test_api_away import FlakyCluster, Master, launcher


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

    def recreate_master(self) -> None:
        self.recreated.append(self.clock.t)
        self.master.silent = lambda t: False  # the successor answers


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
