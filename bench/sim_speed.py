"""Simulator speed: 1,000 nodes, 100 jobs, 24 h of virtual time.

    python bench/sim_speed.py [--hours 24] [--scenario day|dense]

A web service follows a daily pattern (hourly replica changes) at higher
priority; 100 elastic jobs with finite work arrive through the day.
``day``: 1,000 nodes of 32 CPUs, 1,000-7,000 web pods of 2 CPUs (target ≤ 60 s).
``dense``: 1,000 nodes of 31.5 CPUs, 4,000-12,000 web pods of 1 CPU, jobs of up to
64 trainers (target ≤ 20 s): the decision's cost must not grow with the pods.
Writes bench/results/sim_speed.json (dense: sim_speed_dense.json).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

from edl.sim.engine import Simulation  # noqa: E402
from edl.sim.scenario import parse  # noqa: E402


def scenario(hours: float) -> dict:
    duration = hours * 3600
    replicas = [[h * 3600, int(4000 + 3000 * math.sin(2 * math.pi * h / 24))] for h in range(int(math.ceil(hours)))]
    return {
        "name": "day-1000-nodes", "duration_s": duration, "period_s": 5,
        "nodes": [{"count": 1000, "cpu": 32, "memory_gi": 128}],
        "priorities": {"web": 1000, "batch": 0},
        "services": [{"name": "web", "priority": "web", "pod": {"cpu": 2, "memory_gi": 2}, "replicas": replicas}],
        "jobs": [{"name": "job", "count": 100, "submit_at": 0, "submit_every": duration / 110, "priority": "batch",
                  "fixed_pods": [{"role": "ps", "count": 2, "cpu": 2, "memory_gi": 4}],
                  "trainer": {"cpu": 4, "memory_gi": 8}, "min": 2, "max": 60, "static": 10,
                  "work": 20_000_000, "throughput": {"per_trainer": 100, "efficiency": 0.98},
                  "rescale_cost_s": 5}],
    }


def dense(hours: float) -> dict:
    """The cluster of issue 29's figure: many small service pods, so the pods the plan places dominate."""
    sc = scenario(hours)
    sc["name"] = "dense-1000-nodes"
    sc["nodes"] = [{"count": 1000, "cpu": 31.5, "memory_gi": 128}]
    sc["services"][0]["pod"] = {"cpu": 1, "memory_gi": 2}
    sc["services"][0]["replicas"] = [[h * 3600, int(8000 + 4000 * math.sin(2 * math.pi * h / 24))]
                                     for h in range(int(math.ceil(hours)))]
    sc["jobs"][0]["max"] = 64
    return sc


TARGETS = {"day": 60.0, "dense": 20.0}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hours", type=float, default=24.0, help="virtual hours (default 24)")
    p.add_argument("--policy", default="edl", help="policy to run (default edl)")
    p.add_argument("--scenario", choices=sorted(TARGETS), default="day",
                   help="day: 1,000-7,000 web pods of 2 CPUs; dense: 4,000-12,000 of 1 CPU (default day)")
    a = p.parse_args()
    sc = (scenario if a.scenario == "day" else dense)(a.hours)
    sim = Simulation(parse(sc), a.policy, check_invariants=False)
    t = time.perf_counter()
    report = sim.run()
    wall = time.perf_counter() - t
    result = {"scenario": a.scenario, "hours": a.hours, "policy": a.policy, "wall_s": wall, "nodes": 1000,
              "jobs": 100, "decisions": sim.decisions, "utilization_mean": report["utilization"]["mean"],
              "jct_s_mean": report["jct_s_mean"]}
    name = "sim_speed" if a.scenario == "day" else f"sim_speed_{a.scenario}"
    Console().print(f"{a.hours:g} h of virtual time on 1,000 nodes with 100 jobs ({a.scenario}, {a.policy}): "
                    f"{wall:.1f} s, {sim.decisions} decisions (target ≤ {TARGETS[a.scenario]:.0f} s for 24 h); "
                    f"written to {write_result(name, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
