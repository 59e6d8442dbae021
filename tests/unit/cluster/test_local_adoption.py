"""A relaunched ``edl train`` adopts what a killed launcher left (``edl.cluster.local.left_job``): only its
own job (the same arguments), only while that job's master runs and its launcher does not, and only the
processes its file names (a pid with the start it had)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edl.api.spec import JobSpec
from edl.cluster.local import KILLED, LocalCluster, left_job
from edl.jobargs import spec_to_argv
from edl.procs import start_ticks

SPEC = JobSpec(job="j", model_def="edl.zoo.digits", data="d", epochs=1, batch_size=1, min_trainers=1, max_trainers=2,
               trainers=1, checkpoint_uri="/tmp/nowhere")


@pytest.fixture
def sleeper():
    """A live process that is not this one (a trainer, a launcher)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    p.kill()
    p.wait()


def write_left(job_dir, *, launcher, master, trainers, argv=None, standby=None):
    """A job file as a launcher writes it; each process a (pid, ticks) pair."""
    procs = [launcher, master, *trainers.values()] + ([standby] if standby else [])
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "job.json").write_text(json.dumps({
        "job": "j", "address": "127.0.0.1:4242", "token": "tok", "argv": argv or spec_to_argv(SPEC),
        "launcher_pid": launcher[0], "master_pid": master[0], "standby_pid": standby[0] if standby else None,
        "trainers": {name: pid for name, (pid, _) in trainers.items()},
        "ticks": {str(pid): ticks for pid, ticks in procs},
    }))


def me():
    return os.getpid(), start_ticks(os.getpid())


def gone():
    """The pid and start of a process that ran and is no more."""
    p = subprocess.Popen(["true"])
    ticks = start_ticks(p.pid) or 1
    p.wait()
    return p.pid, ticks


def test_a_job_whose_launcher_is_gone_is_adopted_with_its_live_and_ended_trainers(tmp_path, sleeper):
    write_left(tmp_path, launcher=gone(), master=me(),
               trainers={"j-t1": (sleeper.pid, start_ticks(sleeper.pid)), "j-t2": gone()})
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "j-t2.exit").write_text("0\n")
    left = left_job(SPEC, tmp_path)
    assert left is not None and (left.address, left.token) == ("127.0.0.1:4242", "tok")
    assert left.master.pid == os.getpid() and left.master.poll() is None
    assert left.trainers["j-t1"].poll() is None
    assert left.trainers["j-t2"].poll() == 0  # it left, and said so
    left.trainers["j-t2"].exit_path.unlink()
    assert left.trainers["j-t2"].poll() == 0  # read once: an exit does not change
    cluster = LocalCluster(SPEC, tmp_path, {"EDL_STANDBY_MASTER": "0"}, adopt=left)
    assert cluster.address == "127.0.0.1:4242" and cluster.port == 4242 and cluster.token == "tok"
    saved = json.loads((tmp_path / "job.json").read_text())
    assert saved["launcher_pid"] == os.getpid() and saved["trainers"] == {"j-t1": sleeper.pid}


def test_an_adopted_trainer_that_left_no_exit_code_was_killed(tmp_path, sleeper):
    write_left(tmp_path, launcher=gone(), master=me(), trainers={"j-t1": gone()})
    left = left_job(SPEC, tmp_path)
    assert left is not None and left.trainers["j-t1"].poll() == KILLED
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "j-t1.log").write_text("checkpoint at step 393 committed in 0.30 s\n")
    cluster = LocalCluster(SPEC, tmp_path, {"EDL_STANDBY_MASTER": "0"}, adopt=left)
    # Its last line said what it was doing, not why it ended.
    assert [t.message for t in cluster.trainers()] == [
        "killed by SIGKILL (its last line: checkpoint at step 393 committed in 0.30 s)"]


@pytest.mark.parametrize("case", ["launcher alive", "master gone", "other arguments", "no file"])
def test_nothing_is_adopted_but_a_live_master_of_the_same_job_whose_launcher_is_gone(tmp_path, sleeper, case):
    live = (sleeper.pid, start_ticks(sleeper.pid))
    if case == "launcher alive":
        write_left(tmp_path, launcher=live, master=me(), trainers={})
    elif case == "master gone":
        write_left(tmp_path, launcher=gone(), master=gone(), trainers={})
    elif case == "other arguments":
        write_left(tmp_path, launcher=gone(), master=me(), trainers={},
                   argv=[*spec_to_argv(SPEC), "--epochs", "2"])
    assert left_job(SPEC, tmp_path) is None
