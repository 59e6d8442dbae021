"""``edl simulate``: run a scenario under one or more policies, write the report and the plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edl.errors import UserError
from edl.sim.bound import utilization_bound
from edl.sim.engine import Simulation
from edl.sim.scenario import Scenario


def _mean(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _bound(scenario: Scenario, policy: str) -> dict:
    """The best any policy could do on this scenario (see ``edl.sim.bound``); None if too costly."""
    try:
        b = utilization_bound(scenario, policy)
    except UserError:
        return {"bound_mean": None, "bound_offpeak_mean": None}
    return {"bound_mean": b["mean"], "bound_offpeak_mean": b["offpeak_mean"]}


def simulate(scenario: Scenario, policy: str, runs: int = 1, seed: int = 0) -> tuple[dict, Simulation]:
    reports, first = [], None
    for k in range(runs):
        sim = Simulation(scenario, policy, seed=seed + k)
        reports.append(sim.run())
        first = first or sim
    r0 = reports[0]
    out = {
        "scenario": scenario.name,
        "policy": policy,
        "runs": runs,
        "utilization": {**{key: _mean([r["utilization"][key] for r in reports]) for key in ("mean", "offpeak_mean", "p5")},
                        **_bound(scenario, policy)},
        "pending_s_mean": _mean([r["pending_s_mean"] for r in reports]),
        "jct_s_mean": _mean([r["jct_s_mean"] for r in reports]) if all(r["jct_s_mean"] is not None for r in reports) else None,
        "fairness_jain": _mean([r["fairness_jain"] for r in reports]),
        "services": [{"name": s["name"],
                      "lag_s_max": max(r["services"][i]["lag_s_max"] for r in reports),
                      "lag_s_mean": _mean([r["services"][i]["lag_s_mean"] for r in reports])}
                     for i, s in enumerate(r0["services"])],
        "jobs": r0["jobs"] if runs == 1 else [
            {"name": j["name"],
             "pending_s": _mean([r["jobs"][i]["pending_s"] for r in reports]),
             "jct_s": _mean([r["jobs"][i]["jct_s"] for r in reports]),
             "trainers_mean": _mean([r["jobs"][i]["trainers_mean"] for r in reports])}
            for i, j in enumerate(r0["jobs"])],
        "rescale_events": _mean([r["rescale_events"] for r in reports]),
        "wall_s": sum(r["wall_s"] for r in reports),
    }
    return out, first


def plot(sim: Simulation, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = sim.timeline
    t = [x["t"] for x in tl]
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    axes[0].plot(t, [100 * x["util"] for x in tl], color="tab:blue")
    axes[0].set_ylabel("CPU requested by\nrunning pods (%)")
    axes[0].set_ylim(0, 100)
    names = sorted(sim.jobs)
    for name in names:
        axes[1].plot(t, [x["trainers"].get(name, 0) for x in tl], linewidth=0.8)
    axes[1].set_ylabel("running trainers\nper job")
    axes[2].plot(t, [x["pending_jobs"] for x in tl], color="tab:red")
    axes[2].set_ylabel("jobs with no\npod running")
    for s in sim.sc.services:
        axes[3].plot(t, [x["services"][s.name][0] for x in tl], label=f"{s.name} running")
        axes[3].plot(t, [x["services"][s.name][1] for x in tl], linestyle="--", label=f"{s.name} target")
    if sim.sc.services:
        axes[3].legend(loc="upper right")
    axes[3].set_ylabel("service replicas")
    axes[3].set_xlabel("virtual time (s)")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
