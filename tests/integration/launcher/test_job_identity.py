"""One job per checkpoint prefix, one live run per job (``edl train`` on this machine)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from edl.api.spec import JobSpec
from edl.jobargs import spec_to_argv
from edl.masterlink import HttpMaster
from edl.net import free_port
from tests.conftest import edl_cmd, run_edl
from tests.waits import wait_for
from tests.integration.launcher.test_elastic_jobs import assert_exactly_once, job_args, summary

pytestmark = pytest.mark.timeout(240)


def tree(root) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def refusal(r) -> str:
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, r.stdout + r.stderr
    return lines[0]


def test_another_job_on_a_prefix_is_refused_naming_its_owner(digits, tmp_path, job_runner):
    first = job_runner("daya", job_args(digits, tmp_path, epochs=1, trainers=1)).start()
    assert first.wait() == 0, first.output()
    before = tree(tmp_path / "ckpt")
    start = time.monotonic()
    r = run_edl("train", "--job-name", "dayb", *job_args(digits, tmp_path, epochs=3, trainers=1), timeout=20)
    assert r.returncode == 2
    assert time.monotonic() - start < 20
    line = refusal(r)
    assert "'daya'" in line and "--checkpoint-uri" in line
    assert tree(tmp_path / "ckpt") == before


def test_a_second_run_of_a_running_job_is_refused_and_the_first_finishes(digits, tmp_path, job_runner):
    # 40 epochs (1,800 steps on two trainers, 20 s or more here): the refusal comes within seconds of the first
    # run's step 20, well before it ends (10 epochs, 6 s on an idle machine, ended before the second run had
    # started up and checked, which then ran the job again).
    epochs = 40
    first = job_runner("twice", job_args(digits, tmp_path, epochs=epochs, trainers=2)).start()
    first.wait_for(lambda s: s["step"] > 20, what="the first run training")
    start = time.monotonic()
    r = run_edl("train", "--job-name", "twice", *job_args(digits, tmp_path, epochs=epochs, trainers=2), timeout=20)
    assert r.returncode == 2
    assert time.monotonic() - start < 20
    line = refusal(r)
    assert "job 'twice' is already running" in line and "pid" in line
    assert first.wait() == 0, first.output()
    assert_exactly_once(summary(tmp_path), epochs)
    assert first.status() is None  # its master is gone, and so is its lock: the same command may run again
    again = run_edl("train", "--job-name", "twice", *job_args(digits, tmp_path, epochs=epochs, trainers=2),
                    timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_restarted_master_serves_only_once_its_live_predecessor_has_stopped(digits, tmp_path):
    """Two masters of one run (one token) on one prefix, the first alive beside its successor as on a
    lost node: the successor takes the lock at once but answers only after the first has seen the
    lock taken (its next renewal fails) and stopped. Never two masters of a run serving at once."""
    spec = JobSpec(job="fence", model_def="edl.zoo.digits", data=str(digits), epochs=50, batch_size=16,
                   min_trainers=1, max_trainers=1, trainers=1, checkpoint_uri=str(tmp_path / "ckpt"),
                   launcher_timeout_s=600)
    env = {**os.environ, "EDL_TOKEN": "one-run", "PYTHONUNBUFFERED": "1"}

    def master(port: int, log: str) -> subprocess.Popen:
        return subprocess.Popen(edl_cmd("master", *spec_to_argv(spec), "--port", str(port)), env=env,
                                stdout=open(tmp_path / log, "w"), stderr=subprocess.STDOUT)

    first_port, second_port = free_port(), free_port()
    first = master(first_port, "first.log")
    second = None
    try:
        wait_for(HttpMaster(f"127.0.0.1:{first_port}", "one-run", give_up_s=0).healthy, 60, "the first master")
        second = master(second_port, "second.log")
        successor = HttpMaster(f"127.0.0.1:{second_port}", "one-run", timeout_s=1.0, give_up_s=0)
        wait_for(lambda: successor.healthy() or second.poll() is not None, 60, "the successor answering",
                 every=0.05)
        predecessor_exit = first.poll()  # the moment the successor first answered
        assert second.poll() is None, (tmp_path / "second.log").read_text()
        assert predecessor_exit is not None, "the successor served while its predecessor still ran"
        assert predecessor_exit == 1 and "run lock was taken over" in (tmp_path / "first.log").read_text()
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
