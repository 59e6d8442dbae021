"""Trainer faults at any rank, in one real job: SIGKILL of the first, a middle and the last rank in
groups of 4, 3 and 2, and a trainer that stops without dying (SIGSTOP) and wakes up later (SIGCONT).

Every fault must cost at most the failed step: the survivors stay (none is dropped or exits), the
next generation starts from their own state (never the checkpoint), a hung trainer is dropped
well before its lease runs out and, woken, is told so and leaves, and ``--audit`` still counts
every record exactly once.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from edl.procs import wait_ended
from tests.conftest import run_edl
from tests.integration.launcher.test_elastic_jobs import full_speed, job_args, slow_model_def

pytestmark = pytest.mark.timeout(420)

# Long enough for the whole sequence of faults to land before the data runs out, on a loaded machine
# too: each step takes 40 ms or more until the last fault (30 epochs at full speed ran out before the
# SIGSTOP case once), 40 epochs of 22-45 steps, 35 s or more.
EPOCHS = 40
STEP_FLOOR_S = 0.04


def settled(n: int, after_step: int = 0):
    """``n`` trainers training, the last change over (its pause measured), past ``after_step``."""
    return lambda s: (s["world_size"] == n and s["phase"] == "running" and s["step"] > after_step
                      and s["generations"][-1]["pause_s"] is not None)


def next_failure(st: dict, generation: int) -> dict | None:
    return next((g for g in st["generations"] if g["master_generation"] > generation and g["reason"] == "failure"
                 and g["first_step_at"] is not None), None)


def fault(job, st: dict, rank: int, sig: signal.Signals) -> tuple[dict, dict, dict]:
    """Send ``sig`` to the trainer at ``rank``; answers (victim, the failure generation, status then)."""
    victim = next(t for t in st["trainers"] if t["rank"] == rank)
    survivors = {t["id"] for t in st["trainers"] if t["rank"] is not None} - {victim["id"]}
    before = st["generation"]
    os.kill(victim["pid"], sig)
    st = job.wait_for(lambda s: next_failure(s, before) is not None, what=f"{sig.name} of rank {rank}")
    g = next_failure(st, before)
    where = f"{sig.name} of rank {rank} in a group of {len(survivors) + 1}"
    assert survivors <= set(g["members"]), f"{where}: a survivor was dropped: {g}"
    assert g["source"] == "peer" and g["rolled_back_steps"] <= 1, f"{where}: {g}"
    return victim, g, st


def scale(job, n: int) -> None:
    r = run_edl("scale", job.name, "--trainers", str(n), env={"EDL_HOME": str(job.home)})
    assert r.returncode == 0, r.stderr


def test_trainer_faults_at_any_rank_cost_at_most_the_failed_step(digits, tmp_path, job_runner, framework_digits):
    model = slow_model_def(tmp_path, framework_digits, STEP_FLOOR_S)
    job = job_runner("faults", job_args(digits, tmp_path, epochs=EPOCHS, max_t=4, trainers=4, model=model,
                                        extra=("--max-trainer-failures", "10"))).start()
    st = job.wait_for(settled(4, 20), what="four trainers training")
    kills = 0
    # SIGKILL: the first rank of 4 (it also hosts the group's store), the last of 3, the first of 2.
    for n, rank in ((4, 0), (3, 2), (2, 0)):
        _, _, st = fault(job, st, rank, signal.SIGKILL)
        kills += 1
        scale(job, n - 1)  # no replacement: the next fault hits the smaller group
        st = job.wait_for(settled(n - 1, st["step"] + 5), what=f"{n - 1} trainers after the kill")
    # A trainer that hangs without dying, as rank 0 of 3: dropped, the others go on from their own state.
    scale(job, 3)
    st = job.wait_for(settled(3, st["step"] + 5), what="three trainers again")
    victim, g, st = fault(job, st, 0, signal.SIGSTOP)
    assert g["world_size"] == 2
    st = job.wait_for(lambda s: s["step"] > st["step"] + 10, what="progress without the stopped trainer")
    os.kill(victim["pid"], signal.SIGCONT)  # woken: it is told it was dropped, and leaves on its own
    assert wait_ended(victim["pid"], 30), "the woken trainer did not leave"
    log = (job.home / "jobs" / job.name / "logs" / f"{victim['id']}.log").read_text(errors="replace")
    assert "dropped from the job" in log and "Traceback" not in log, log[-2000:]
    # SIGKILL of the last rank of 2 (the replacement of the woken one may have joined: then of 3).
    st = job.wait_for(lambda s: s["world_size"] >= 2 and s["phase"] == "running"
                      and s["generations"][-1]["pause_s"] is not None, what="two trainers or more")
    _, _, st = fault(job, st, st["world_size"] - 1, signal.SIGKILL)
    kills += 1
    full_speed(model)
    assert job.wait(240) == 0, job.output()[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "succeeded", s["error"]
    assert s["epochs_completed"] == EPOCHS
    assert s["lost_samples"] == 0 and s["duplicate_samples"] == 0
    assert s["audited_samples_per_epoch"] == [1438] * EPOCHS
    # Only the killed trainers and the woken one ended badly: no survivor exited.
    assert s["trainer_failures"] == kills + 1, s
    assert all(g["rolled_back_steps"] <= 1 for g in s["generations"]), s["generations"]


def test_a_joiner_that_stops_responding_in_a_graceful_change_costs_no_rollback(digits, tmp_path, job_runner,
                                                                              framework_digits):
    """The joiner is stopped (SIGSTOP) as soon as it registers: before it formed the prepared generation's
    group (its lease runs out and the change is planned again without it), or after (the others switched
    and wait on it: it is dropped as a hung member). Either way the two trainers go on from their own
    state, the woken joiner leaves, a replacement joins, and every record is trained on exactly once."""
    # The job must outlast two trainer starts (a framework import: up to 10 s on a loaded machine) and the
    # joiner's lease (10 s). A fast machine trained PyTorch's 120 epochs of digits in 22 s, so each step
    # here takes at least 40 ms, whatever the machine: 1,100 steps, 40 s or more.
    epochs = 25
    model = slow_model_def(tmp_path, framework_digits, 0.04)
    job = job_runner("hangjoin", job_args(digits, tmp_path, epochs=epochs, max_t=3, trainers=2, model=model,
                                          extra=("--max-trainer-failures", "5"))).start()
    st = job.wait_for(settled(2, 20), what="two trainers training")
    members = {t["id"] for t in st["trainers"]}
    scale(job, 3)
    st = job.wait_for(lambda s: any(t["id"] not in members for t in s["trainers"]), what="the joiner registered")
    joiner = next(t for t in st["trainers"] if t["id"] not in members)
    os.kill(joiner["pid"], signal.SIGSTOP)
    st = job.wait_for(lambda s: all(t["id"] != joiner["id"] for t in s["trainers"]) and s["phase"] == "running",
                      timeout=60, what="the stopped joiner dropped")
    st = job.wait_for(lambda s: s["step"] > st["step"] + 40, timeout=60, what="progress without it")
    os.kill(joiner["pid"], signal.SIGCONT)
    assert wait_ended(joiner["pid"], 30), "the woken joiner did not leave"
    st = job.wait_for(settled(3, st["step"] + 5), timeout=120, what="a replacement joined")
    full_speed(model)
    assert job.wait(240) == 0, job.output()[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "succeeded", s["error"]
    assert s["lost_samples"] == 0 and s["duplicate_samples"] == 0
    assert s["audited_samples_per_epoch"] == [1438] * epochs
    assert all(g["rolled_back_steps"] == 0 for g in s["generations"]), s["generations"]
    assert s["trainer_failures"] == 1, s  # the joiner; no member of the job was lost


def test_rank_0_killed_once_the_data_is_consumed_the_job_still_finishes(digits, tmp_path, job_runner):
    """Every row trained, the job finishing (rank 0's last checkpoint and export): rank 0 SIGKILLed
    there. The survivors must form a generation and finish, every record counted once."""
    epochs = 6
    model = slow_model_def(tmp_path, "edl.zoo.digits", 0.03)
    job = job_runner("endkill", job_args(digits, tmp_path, epochs=epochs, max_t=3, trainers=3, model=model,
                                         interval=0.5)).start()
    total = None

    def data_consumed(s: dict) -> bool:
        nonlocal total
        total = s["rows_per_epoch"] * s["epochs"]
        return s["world_size"] == 3 and sum(s["done_rows"]) >= total

    st = job.wait_for(data_consumed, timeout=180, what="every row trained")
    rank0 = next(t for t in st["trainers"] if t["rank"] == 0)
    os.kill(rank0["pid"], signal.SIGKILL)
    assert job.wait(120) == 0, job.output()[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "succeeded" and s["epochs_completed"] == epochs, s["error"]
    assert s["lost_samples"] == 0 and s["duplicate_samples"] == 0
