"""The dead-man switch with local processes: a launcher that goes silent leaves nothing running.

``edl train`` SIGSTOPped mid-run is alive but silent; SIGKILLed, it leaves its master and trainers running
(for the same command to adopt: ``test_elastic_jobs``). Either way, when no launcher comes back, only the
switch ends the job: its master stops hearing the launcher's beats, tells the trainers to leave (they exit
0) and exits itself, within the default 30 s plus its linger. The spare master ends at once when the
killed launcher's pipe to it closes, or with the rest."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.launcher.test_elastic_jobs import job_args, slow_model_def
from tests.waits import wait_for

pytestmark = pytest.mark.timeout(240)


def running(pid: int) -> bool:
    """Alive and not a zombie (a stopped launcher cannot reap its children)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["silent", "killed"])
def test_a_launcher_gone_silent_mid_run_leaves_no_process_of_its_job(digits, tmp_path, job_runner, edl_home, sig):
    # Each step takes 20 ms or more: the job outlives the switch's 30 s without training on every CPU.
    model = slow_model_def(tmp_path, "edl.zoo.digits", 0.02)
    job = job_runner("deadman", job_args(digits, tmp_path, epochs=400, trainers=2, model=model)).start()
    job.wait_for(lambda s: s["step"] > 20 and s["world_size"] == 2, what="two trainers training")
    wait_for(lambda: job.info().get("standby_pid") is not None, 60, "the spare master", every=0.2)
    info = job.info()
    # The spare master too: nobody is left to wake it.
    pids = [info["master_pid"], info["standby_pid"], *info["trainers"].values()]
    assert len(pids) == 4 and all(running(p) for p in pids)
    os.kill(job.proc.pid, sig)
    stopped = time.monotonic()
    try:
        wait_for(lambda: not any(running(p) for p in pids), 60, "the master and trainers to end themselves",
                 every=0.5, detail=lambda: f"alive: {[p for p in pids if running(p)]}")
        took = time.monotonic() - stopped
        logs = edl_home / "jobs" / "deadman" / "logs"
        master_log = (logs / "master.log").read_text()
        assert took > 25, took  # not before the 30 s timeout (with a margin for the last beat's age)
        assert "launcher silent for 30 s: ending job deadman" in master_log, master_log[-2000:]
        assert "master exiting" in master_log
        for name in info["trainers"]:
            assert "leaving" in (logs / f"{name}.log").read_text(), name
    finally:
        os.kill(job.proc.pid, signal.SIGKILL)  # a stopped launcher is ended by the fixture's cleanup too
