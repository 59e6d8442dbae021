"""One job per checkpoint prefix, one live run per job (``edl train`` on this machine)."""

from __future__ import annotations

import time

import pytest

from tests.conftest import run_edl
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
    # 10 epochs (450 steps on two trainers): the refusal comes within seconds of the first run's step 20.
    epochs = 10
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
