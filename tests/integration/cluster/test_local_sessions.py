"""Local trainers each run in a session of their own (as ``paddle.distributed.launch`` starts its workers):
where the kernel shares a busy CPU between sessions (autogroup), each trainer gets its share instead of
the whole job sharing one. They outlive a killed launcher, for the same command run again to adopt."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from edl.procs import EXIT_FILE_ENV, recorded_exit
from tests.integration.launcher.test_dead_man_switch import running
from tests.waits import wait_for

pytestmark = pytest.mark.timeout(120)

LAUNCHER = """
import os, sys, time
from pathlib import Path
from edl.api.spec import JobSpec
from edl.cluster.local import LocalCluster

spec = JobSpec(job="sessions", model_def="edl.zoo.digits", data="unused", epochs=1, batch_size=1, min_trainers=1,
               max_trainers=1, trainers=1, checkpoint_uri=sys.argv[1])
cluster = LocalCluster(spec, Path(sys.argv[1]), dict(os.environ))
stale = Path(sys.argv[1]) / "logs" / "sessions-t1.exit"
stale.write_text("2")  # left by an earlier run's trainer of that name
cluster.create_trainer("sessions-t1")  # no master answers at its address: it waits for one
print(cluster.procs_by_name["sessions-t1"].pid, stale.exists(), flush=True)
time.sleep(600)
"""


def test_a_local_trainer_runs_in_a_session_of_its_own_and_outlives_a_killed_launcher(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)], stdout=subprocess.PIPE,
                                env={**os.environ, "EDL_MASTER_GIVE_UP_S": "600"})
    trainer = None
    try:
        pid, stale = launcher.stdout.readline().split()
        trainer = int(pid)
        assert stale == b"False"  # an earlier trainer's exit code is never read as this one's
        assert os.getsid(trainer) == trainer != os.getsid(launcher.pid)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
        # Its exit is not tied to the launcher's: it waits on for its master (which the dead-man switch ends).
        with pytest.raises(AssertionError, match="timed out"):
            wait_for(lambda: not running(trainer), 2, "the trainer to end (it must not)", every=0.2)
    finally:
        launcher.kill()
        launcher.wait()
        if trainer is not None and running(trainer):
            os.kill(trainer, signal.SIGKILL)


def test_a_trainer_leaves_its_exit_code_for_a_launcher_that_is_not_its_parent(tmp_path):
    path = tmp_path / "t.exit"
    r = subprocess.run([sys.executable, "-m", "edl", "trainer", "--master", "127.0.0.1:1"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, EXIT_FILE_ENV: str(path), "EDL_TRAINER_ID": ""})
    assert r.returncode == 2 and "--id is required" in r.stderr, r.stderr
    assert recorded_exit(path) == 2
