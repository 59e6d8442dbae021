"""The launcher beats its master (the dead-man switch, ``edl.master.deadman``) through every blocking
wait of a round, not only between rounds: an API call that takes longer than the master's
``--launcher-timeout`` must not end the job. Real time here: the beats come from a thread."""

from __future__ import annotations

import threading
import time

import pytest
from rich.console import Console

from edl.api.master import JobStatus, JobView
from edl.launcher.core import Launcher
from edl.master.deadman import DeadMan, LauncherState
from tests.unit.launcher.test_api_away import SPEC, FlakyCluster, view

pytestmark = pytest.mark.timeout(60)

SWITCH_S = 2.0  # the master's --launcher-timeout, scaled down
BLOCK_S = 3 * SWITCH_S  # one API call of the launcher's takes this long


class SlowCluster(FlakyCluster):
    """Listing the trainers blocks for ``BLOCK_S`` once (an apiserver answering slowly, retried calls)."""

    def __init__(self) -> None:
        super().__init__(clock=None)  # type: ignore[arg-type]
        self.blocked = threading.Event()

    def _check(self) -> None:
        pass

    def trainers(self):
        if not self.blocked.is_set():
            self.blocked.set()
            time.sleep(BLOCK_S)
        return super().trainers()


class SwitchedMaster:
    """A master with the real dead-man rule on the real monotonic clock; the job ends after ``run_s``."""

    def __init__(self, run_s: float) -> None:
        self.deadman = DeadMan(SWITCH_S, last_beat=time.monotonic(), linger_s=0.0)
        self.ends_at = time.monotonic() + run_s

    def launcher_beat(self, budgets=None) -> None:
        now = time.monotonic()
        self.deadman.state(now)  # as the master's ticker would have looked meanwhile: a late beat is too late
        self.deadman.beat(now)

    def healthy(self) -> bool:
        return True

    def status(self) -> JobView:
        now = time.monotonic()
        if self.deadman.state(now) is not LauncherState.WATCHING:
            return view(1, JobStatus.FAILED)
        return view(1, JobStatus.SUCCEEDED if now >= self.ends_at else JobStatus.RUNNING)

    def report_exit(self, name: str, code: int, preempted: bool = False) -> None:
        pass

    def shutdown(self) -> None:
        pass


def launcher(cluster: SlowCluster, master: SwitchedMaster, **kw) -> Launcher:
    return Launcher(SPEC, cluster, console=Console(quiet=True), master_factory=lambda endpoint: master,
                    trainer_prefix="j-t", beat_every_s=SWITCH_S / 10, **kw)


def test_a_round_blocked_longer_than_the_switch_keeps_beating_and_the_job_goes_on():
    cluster, master = SlowCluster(), SwitchedMaster(run_s=BLOCK_S + 2.0)
    la = launcher(cluster, master, beat_in_background=True)
    la.start()
    try:
        final = la.run(poll_s=0.05)
    finally:
        la.shutdown(delete=False)
    assert cluster.blocked.is_set()
    assert not master.deadman.abandoned, f"abandoned after {master.deadman.silent_s(time.monotonic()):.1f} s"
    assert final.status is JobStatus.SUCCEEDED


def test_a_launcher_whose_loop_no_longer_comes_round_stops_beating():
    cluster, master = SlowCluster(), SwitchedMaster(run_s=60.0)
    la = launcher(cluster, master, beat_in_background=True, loop_stall_s=SWITCH_S / 2)
    la.start()
    try:
        la.run(poll_s=0.05)  # the switch fires during the blocked round: the master ends the job
    finally:
        la.shutdown(delete=False)
    assert master.deadman.abandoned
