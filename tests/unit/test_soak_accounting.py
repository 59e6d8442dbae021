"""The soak's accounting (``bench/soak.py``): the time in the final model's steps, from the audit's
records of them, and the time lost, charged to the fault before it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from edl.storage.audit import kept_steps

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def soak():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("soak", BENCH / "soak.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["soak"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def log(gen: tuple[int, int], base: int, steps: range, t0: float, dt: float, trainers=("a",)) -> list[str]:
    """The audit lines of a generation: its base, then each trainer's record of each step."""
    out = [json.dumps({"gen": list(gen), "base": base})]
    for i, step in enumerate(steps):
        for k, t in enumerate(trainers):
            out.append(json.dumps({"gen": list(gen), "step": step, "at": t0 + i * dt + 0.001 * k,
                                   "records": {"0": [step * 10 + k]}}))
    return out


def test_steady_steps_are_all_kept(soak):
    acc = soak.account(kept_steps(log((1, 1), 0, range(1, 102), 100.0, 0.1, ("a", "b"))), [])
    assert acc.ratio == pytest.approx(1.0) and acc.wall_s == pytest.approx(10.0) and acc.lost_s == {}


def test_a_pause_is_lost_and_charged_to_the_fault_before_it(soak):
    lines = log((1, 1), 0, range(1, 51), 0.0, 0.1) + log((1, 2), 50, range(51, 81), 4.9 + 2.0, 0.1)
    acc = soak.account(kept_steps(lines), [soak.Fault(3.0, "scale"), soak.Fault(4.95, "trainer-sigkill")])
    # Step 51 comes 2.0 s after step 50, where a step takes 0.1 s.
    assert acc.lost_s == {"trainer-sigkill": pytest.approx(1.9)}
    assert acc.kept_s + 1.9 == pytest.approx(acc.wall_s)


def test_steps_rolled_back_are_not_kept_and_their_time_is_lost(soak):
    # Steps 1..40 by t = 3.9; the master restarts from step 20's checkpoint at t = 4.5.
    lines = log((1, 1), 0, range(1, 41), 0.0, 0.1) + log((2, 1), 20, range(21, 61), 4.5, 0.1)
    acc = soak.account(kept_steps(lines), [soak.Fault(3.0, "master-sigkill")])
    assert [s for _, s in acc.timeline] == list(range(1, 61))
    # Step 21 of the second run comes 2.6 s after step 20 of the first, where 0.1 s was due.
    assert acc.lost_s["master-sigkill"] == pytest.approx(2.5)
    assert acc.ratio == pytest.approx((acc.wall_s - 2.5) / acc.wall_s)


def test_each_generation_is_judged_by_its_own_step_time(soak):
    # Slower steps at a larger world size are training, not loss.
    lines = log((1, 1), 0, range(1, 21), 0.0, 0.1) + log((1, 2), 20, range(21, 41), 2.0, 0.3)
    acc = soak.account(kept_steps(lines), [])
    assert sum(acc.lost_s.values()) == pytest.approx(0.0, abs=1e-9) and acc.ratio == pytest.approx(1.0)


def test_a_slow_step_is_training_and_a_stall_is_lost_but_the_paced_ratio_counts_both(soak):
    # 0.1 s steps; step 11 takes 0.3 s (a slow step: within four typical steps), step 21 takes 0.6 s (a stall).
    times, t = [], 0.0
    for step in range(1, 31):
        t += 0.3 if step == 11 else 0.6 if step == 21 else 0.1
        times.append(t)
    lines = [json.dumps({"gen": [1, 1], "base": 0})] + [
        json.dumps({"gen": [1, 1], "step": step, "at": at, "records": {"0": [step]}})
        for step, at in zip(range(1, 31), times)]
    acc = soak.account(kept_steps(lines), [soak.Fault(0.5, "scale")])
    assert acc.lost_s == {"scale": pytest.approx(0.5)}  # the stall, beyond its one step
    assert acc.ratio == pytest.approx((acc.wall_s - 0.5) / acc.wall_s)
    assert acc.paced_ratio == pytest.approx((acc.wall_s - 0.5 - 0.2) / acc.wall_s)  # the slow step's 0.2 s too
    assert acc.slow_each == {0: pytest.approx(0.2)}  # charged to the fault before it, apart from the lost time


def test_a_gap_of_four_typical_steps_is_still_a_step(soak):
    lines = log((1, 1), 0, range(1, 21), 0.0, 0.1) + log((1, 1), 20, range(21, 31), 1.9 + 0.4, 0.1)[1:]
    acc = soak.account(kept_steps(lines), [])
    assert acc.lost_s == {} and acc.ratio == pytest.approx(1.0)
    lines = log((1, 1), 0, range(1, 21), 0.0, 0.1) + log((1, 1), 20, range(21, 31), 1.9 + 0.45, 0.1)[1:]
    assert soak.account(kept_steps(lines), []).lost_s == {"start": pytest.approx(0.35)}


def test_a_launcher_that_failed_before_its_summary_is_reported_with_its_error(soak, tmp_path):
    log = tmp_path / "launcher-3.log"
    log.write_text("epoch 1/2\nedl: error: trainer id 'soak-t41' is already left in job soak\n")
    assert soak.failed_without_summary(log, 2) == {"status": "failed",
                                                   "error": "trainer id 'soak-t41' is already left in job soak"}
    log.write_text("killed\n")
    assert soak.failed_without_summary(log, -9)["error"] == "the launcher exited -9 without a summary"


def test_each_fault_is_matched_to_the_change_it_began_and_summed_by_kind(soak):
    faults = [soak.Fault(100.0, "pod-kill", "edl-soak-trainer-3"), soak.Fault(130.0, "apiserver-stop"),
              soak.Fault(160.0, "node-lost", "node-1: edl-soak-trainer-4"), soak.Fault(200.0, "master-delete"),
              soak.Fault(230.0, "trainer-sigkill", "4242")]
    gens = [{"id": 1, "wall_at": 10.0, "cause": "the job started", "source": "init", "chain": {"formed": 0.0}},
            {"id": 2, "wall_at": 100.25, "cause": "edl-soak-trainer-3 ended (exit 137; seen by the launcher)",
             "source": "peer", "chain": {"stopped": 0.1, "formed": 0.5, "first_step": 0.75}},
            {"id": 3, "wall_at": 135.0, "cause": "edl-soak-trainer-5 joined", "source": "peer", "chain": {}},
            # the replacement's join comes first; the node's trainer falls silent after it
            {"id": 4, "wall_at": 160.5, "cause": "edl-soak-trainer-6 joined", "source": "peer", "chain": {}},
            {"id": 5, "wall_at": 165.0, "cause": "edl-soak-trainer-4 silent for 10 s (its lease)",
             "source": "peer", "chain": {"stopped": 0.2, "formed": 0.7, "first_step": 1.25}},
            {"id": 6, "wall_at": 202.0, "cause": "a new master: the one before was lost, its trainers registered "
                                                 "again", "source": "peer", "chain": {"formed": 0.1, "first_step": 0.3}},
            {"id": 7, "wall_at": 230.5, "cause": "soak-t2 silent for 10 s (its lease)", "source": "peer",
             "chain": {"formed": 0.1, "first_step": 0.2}}]
    rows = soak.breakdown(faults, gens, {0: 1.0, 2: 2.0, 3: 2.5})
    assert rows[0] == {"kind": "pod-kill", "lost_s": 1.0, "generation": 2, "source": "peer", "told_s": 0.25,
                       "cause": "edl-soak-trainer-3 ended (exit 137; seen by the launcher)",
                       "stopped_s": 0.1, "formed_s": 0.5, "first_step_s": 0.75}
    assert rows[1] == {"kind": "apiserver-stop", "lost_s": 0.0}  # the join after it is not its doing
    assert rows[2]["generation"] == 5 and rows[2]["told_s"] == 5.0
    assert rows[3]["generation"] == 6 and rows[3]["told_s"] == 2.0
    assert rows[4]["generation"] == 7  # a local trainer's pid: the first change after it
    kinds = soak.chains_by_kind(rows)
    assert kinds["node-lost"] == {"count": 1, "changed": 1, "told_s": 5.0, "stopped_s": 0.2, "formed_s": 0.7,
                                  "first_step_s": 1.25, "lost_s": 2.0,
                                  "causes": {"a trainer silent for 10 s (its lease)": 1}}
    assert kinds["trainer-sigkill"]["causes"] == {"a trainer silent for 10 s (its lease)": 1}
    assert kinds["apiserver-stop"]["changed"] == 0 and kinds["apiserver-stop"]["told_s"] is None
