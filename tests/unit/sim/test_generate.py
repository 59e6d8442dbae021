"""The scenario generator: pure, seeded, and always a valid simulator input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edl.sim.engine import Simulation
from edl.sim.generate import draw, generate
from edl.sim.report import generated_benchmark
from edl.sim.scenario import parse


def test_same_seed_same_scenario_and_different_seeds_differ():
    assert draw(7) == draw(7)
    assert generate(7) == generate(7)
    assert draw(7) != draw(8)


@pytest.mark.parametrize("seed", range(1, 21))
def test_drawn_scenarios_parse_and_follow_the_stated_distributions(seed):
    d = draw(seed)
    sc = parse(d)  # the same validation a scenario file gets
    assert 40 <= sum(g.count for g in sc.nodes) <= 160
    assert {g.allocatable.cpu for g in sc.nodes} <= {16.0, 17.654, 32.0}
    assert 1 <= len(sc.services) <= 2 and all(s.priority > 0 for s in sc.services)
    assert 2 <= len(d["jobs"]) <= 4
    gpu_nodes = any(g.allocatable.gpu > 0 for g in sc.nodes)
    smallest = min(g.allocatable.cpu for g in sc.nodes)
    for j in sc.jobs:
        assert j.priority == 0 and 1 <= j.min <= j.static <= j.max
        assert j.trainer.cpu <= smallest
        assert j.trainer.gpu == 0 or gpu_nodes  # GPU trainers only on a GPU cluster
        assert 0.85 <= j.efficiency <= 0.99 and 2 <= j.rescale_cost_s <= 30
        assert j.work is not None and j.work > 0
    last_submit = max(j.submit_at for j in sc.jobs)
    assert sc.duration_s > last_submit


def test_a_generated_scenario_runs_and_every_job_finishes_under_off():
    sc = generate(3)
    r = Simulation(sc, "off", check_invariants=True).run()  # asserts no node over capacity each tick
    assert all(j["jct_s"] is not None for j in r["jobs"])  # the horizon leaves room for every job


def test_benchmark_ratios_are_consistent_with_the_rows():
    out = generated_benchmark([3], ["off", "edl"], bound=False)
    row = out["scenarios"][0]["policies"]
    ratio = out["summary"]["pairs"]["edl/off"]
    assert ratio["median"] == pytest.approx(row["edl"]["jct_s_mean"] / row["off"]["jct_s_mean"])
    assert out["summary"]["policies"]["edl"]["lag_periods_worst"] == row["edl"]["lag_periods_max"]


def test_edl_simulate_generate_end_to_end(tmp_path):
    out = tmp_path / "gen.json"
    proc = subprocess.run([sys.executable, "-m", "edl", "simulate", "--generate", "1", "--seed", "3",
                           "--compare", "off,edl", "--no-bound", "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["seeds"] == [3] and set(result["scenarios"][0]["policies"]) == {"off", "edl"}
    assert "edl/off" in result["summary"]["pairs"]


def test_edl_simulate_needs_a_scenario_or_generate():
    proc = subprocess.run([sys.executable, "-m", "edl", "simulate"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--scenario" in proc.stderr and "Traceback" not in proc.stderr


def test_jct_bound_is_below_every_policy_and_rescales_at_no_cost_are_a_variant():
    out = generated_benchmark([3], ["off", "edl", "edl@free"], bound=False)
    row = out["scenarios"][0]
    assert row["jct_bound_s"] is not None and row["jct_bound_s"] > 0
    for name, p in row["policies"].items():
        assert row["jct_bound_s"] <= p["jct_s_mean"], name  # no policy beats every job alone at its max
    assert set(out["summary"]["jct_bound_over"]) == {"off", "edl", "edl@free"}
    assert all(0 < v["median"] <= 1 for v in out["summary"]["jct_bound_over"].values())


def test_jct_bound_of_a_lone_job_is_what_it_reaches_at_its_max():
    from edl.sim.bound import jct_lower_bound

    doc = draw(3)
    family = dict(doc["jobs"][0], count=1, submit_at=0)
    doc = dict(doc, jobs=[family], services=[], priorities={"batch": 0})
    sc = parse(doc)
    bound = jct_lower_bound(sc)
    jct = Simulation(sc, "edl").run()["jct_s_mean"]
    # Alone on the cluster, edl grows the job to its max: only start-up and scheduling stand between.
    assert bound <= jct <= bound + 3 * sc.jobs[0].startup_s + 2 * sc.period_s


def test_an_unknown_policy_variant_is_refused():
    from edl.errors import UserError

    with pytest.raises(UserError, match="@free"):
        generated_benchmark([3], ["edl@fast"], bound=False)
