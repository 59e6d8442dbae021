"""A local job under a steady rain of ordinary disruptions: one action every 3-6 s, drawn from a
seeded schedule (scale to 1-3 trainers, SIGKILL of a trainer or of the master, a trainer stopped
for 4 s). However many there are, the job succeeds and ``--audit`` counts every record exactly
once: failures are forgiven by the steps trained between them (``edl.launcher.budget``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest

from tests.conftest import run_edl
from tests.integration.launcher.test_elastic_jobs import full_speed, slow_model_def

pytestmark = pytest.mark.timeout(900)
# The suite's short run; EDL_CHAOS_FULL=1 runs the size the issue states (40,000 rows of 256 features,
# 5 epochs: about five minutes a seed on two cores).
ROWS, EPOCHS = (40000, 5) if os.environ.get("EDL_CHAOS_FULL") else (12000, 3)
# The short run's steps take at least this long, so that it lives through its actions on any machine
# (about 250 steps: 50 s or more; a fast machine trained it in 18 s, through two actions), until
# FLOORED_ACTIONS have been done: then it trains at its own speed, under the same rain, to its end.
STEP_FLOOR_S = 0.2
FLOORED_ACTIONS = 12


def disrupt(job, rng: random.Random, log: list[str]) -> None:
    """One action of the schedule, on whatever the job runs now."""
    try:
        info = job.info()
    except (OSError, ValueError):
        return  # between masters: job.json is being rewritten
    trainers = list((info.get("trainers") or {}).values())
    kind = rng.choice(["scale", "kill-trainer", "kill-master", "stop-trainer"])
    if kind == "scale":
        n = rng.randint(1, 3)
        run_edl("scale", job.name, "--trainers", str(n), env={"EDL_HOME": str(job.home)})
        log.append(f"scale {n}")
        return
    pid = info.get("master_pid") if kind == "kill-master" else (rng.choice(trainers) if trainers else None)
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGSTOP if kind == "stop-trainer" else signal.SIGKILL)
        log.append(f"{kind} {pid}")
        if kind == "stop-trainer":
            time.sleep(4)
            os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


@pytest.mark.parametrize("seed", [11, 23])
def test_a_job_under_an_action_every_3_to_6_s_succeeds_exactly_once(seed, tmp_path, job_runner):
    data = tmp_path / "data"
    r = run_edl("data", "prepare", "synthetic", "--rows", str(ROWS), "--features", "256", "--classes", "10",
                "--out", str(data), timeout=300)
    assert r.returncode == 0, r.stderr
    model = "edl.zoo.mlp" if os.environ.get("EDL_CHAOS_FULL") else slow_model_def(tmp_path, "edl.zoo.mlp", STEP_FLOOR_S)
    job = job_runner(f"chaos{seed}", [
        "--model-def", model, "--data", str(data / "train"), "--epochs", str(EPOCHS), "--batch-size", "64",
        "--min-trainers", "1", "--max-trainers", "3", "--trainers", "2", "--checkpoint-uri", str(tmp_path / "ckpt"),
        "--checkpoint-interval", "4", "--audit", "--summary-out", str(tmp_path / "summary.json")]).start()
    job.wait_for(lambda s: s["step"] > 0, 120, "training")
    rng = random.Random(seed)
    actions: list[str] = []
    floored = not os.environ.get("EDL_CHAOS_FULL")
    assert job.proc is not None
    while job.proc.poll() is None:
        time.sleep(rng.uniform(3, 6))
        if job.proc.poll() is None:
            disrupt(job, rng, actions)
            if floored and len(actions) >= FLOORED_ACTIONS:
                full_speed(model)
                floored = False
    code = job.wait(60)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert code == 0 and s["status"] == "succeeded", (actions, s.get("error"), job.output()[-3000:])
    assert s["lost_samples"] == 0 and s["duplicate_samples"] == 0, actions
    assert len(actions) >= 5, actions  # the job lived through a fair number of them
    budgets = s["budgets"]
    assert budgets["master_restarts"]["spent"] <= budgets["master_restarts"]["limit"]
