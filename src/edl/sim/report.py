"""``edl simulate``: run a scenario under one or more policies, write the report and the plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edl.errors import UserError
from edl.sim.bound import placed_bound, utilization_bound
from edl.sim.engine import Simulation
from edl.sim.scenario import Scenario


def _mean(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


NO_BOUNDS = {"bound_mean": None, "bound_offpeak_mean": None, "job_pods_bound_mean": None,
             "job_pods_bound_offpeak_mean": None, "trainers_bound_mean": None, "trainers_bound_offpeak_mean": None}


def _bound(scenario: Scenario, policy: str) -> dict:
    """The best any policy could do on this scenario (see ``edl.sim.bound``); None if too costly."""
    try:
        b = utilization_bound(scenario, policy)
    except UserError:
        return {"bound_mean": None, "bound_offpeak_mean": None}
    return {"bound_mean": b["mean"], "bound_offpeak_mean": b["offpeak_mean"]}


def _placed_bounds(scenario: Scenario, runs: list[tuple[list, float]]) -> dict:
    """The best packing around what each run's scheduler placed (``edl.sim.bound.placed_bound``), mean
    over the runs (``Simulation.placed`` and the cluster's CPU of each): ``job_pods_*`` keeps the
    services' pods where they ran, ``trainers_*`` also the jobs' fixed pods (all a policy that places
    only trainers can use)."""
    out: dict = {}
    try:
        for prefix, which in (("trainers_", 0), ("job_pods_", 1)):
            per_run = [placed_bound([x[which] for x in placed], total_cpu, scenario.offpeak)
                       for placed, total_cpu in runs]
            out[f"{prefix}bound_mean"] = _mean([b["mean"] for b in per_run])
            out[f"{prefix}bound_offpeak_mean"] = _mean([b["offpeak_mean"] for b in per_run])
    except UserError:
        return {k: None for k in NO_BOUNDS if k.startswith(("trainers_", "job_pods_"))}
    return out


def simulate(scenario: Scenario, policy: str, runs: int = 1, seed: int = 0,
             bound: bool = True) -> tuple[dict, Simulation]:
    """``runs`` runs of ``policy`` with consecutive seeds, averaged; with ``bound``, the utilization
    bounds beside the figures (every pod packed, and packed around what each run placed)."""
    reports, placements, first = [], [], None
    for k in range(runs):
        sim = Simulation(scenario, policy, seed=seed + k, record_placement=bound)
        reports.append(sim.run())
        placements.append((sim.placed or [], sim.total_cpu))
        sim.placed = None
        first = first or sim
    r0 = reports[0]
    out = {
        "scenario": scenario.name,
        "policy": policy,
        "runs": runs,
        "utilization": {**{key: _mean([r["utilization"][key] for r in reports]) for key in ("mean", "offpeak_mean", "p5")},
                        **({**_bound(scenario, policy), **_placed_bounds(scenario, placements)} if bound else NO_BOUNDS)},
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
    assert first is not None  # runs >= 1
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


def _censored(report: dict, scenario: Scenario, key: str) -> list[float]:
    """Each job's ``key`` (``jct_s``, ``pending_s``) in seconds, a job that never got there counted to
    the horizon (a lower bound)."""
    submit = {j.name: j.submit_at for j in scenario.jobs}
    return [j[key] if j[key] is not None else scenario.duration_s - submit[j["name"]] for j in report["jobs"]]


def _jct_censored(report: dict, scenario: Scenario) -> float:
    """Mean JCT, counting a job that never finished as running until the horizon."""
    vals = _censored(report, scenario, "jct_s")
    return float(np.mean(vals)) if vals else 0.0


def _pending_max(report: dict, scenario: Scenario) -> float:
    """The longest a job waited to train (to its first trainer running; never: to the horizon)."""
    return max(_censored(report, scenario, "pending_s"), default=0.0)


def generated_benchmark(seeds: list[int], policies: list[str], runs: int = 1, bound: bool = True,
                        progress=None) -> dict:
    """Every policy over the generated scenarios of ``seeds`` (``edl.sim.generate``).

    A policy written ``NAME@free`` runs ``NAME`` with every job's ``rescale_cost_s`` set to 0: how
    much of the distance to ``off`` or to the JCT bound the rescale pauses account for.

    Per scenario: each policy's mean JCT (unfinished jobs counted to the horizon), the JCT lower
    bound (``edl.sim.bound.jct_lower_bound``: every job alone at its ``max``), utilization and
    its packing bound (the linear relaxation, sampled every 30 s: still an upper bound), and the
    worst lag of the services in decision periods, and the longest a job waited for its first trainer
    to run (one that never started counted to the horizon). Summary: for every pair of policies the median
    and worst ratio of mean JCT (``a/b`` below 1: ``a`` is faster), and each policy's median and worst
    utilization-to-bound, worst service lag and longest wait to train.
    """
    import dataclasses

    from edl.sim.bound import jct_lower_bound
    from edl.sim.generate import generate

    rows = []
    for seed in seeds:
        sc = generate(seed)
        row: dict = {"seed": seed, "nodes": sum(g.count for g in sc.nodes), "jobs": len(sc.jobs),
                     "services": len(sc.services), "duration_s": sc.duration_s,
                     "jct_bound_s": jct_lower_bound(sc), "policies": {}}
        bounds: dict[str, float | None] = {}
        for p in policies:
            name, _, variant = p.partition("@")
            if variant not in ("", "free"):
                raise UserError(f"policy {p!r}: the only variant is NAME@free (rescales at no cost)")
            run_sc = sc if not variant else dataclasses.replace(
                sc, jobs=tuple(dataclasses.replace(j, rescale_cost_s=0.0) for j in sc.jobs))
            rep, _ = simulate(run_sc, name, runs, bound=False)
            kind = "off" if name == "off" else "elastic"
            if bound and kind not in bounds:
                try:
                    bounds[kind] = utilization_bound(sc, p, relaxed=True, step_s=30.0)["mean"]
                except UserError:
                    bounds[kind] = None
            kind_bound = bounds.get(kind)
            util = rep["utilization"]["mean"]
            row["policies"][p] = {
                "jct_s_mean": _jct_censored(rep, sc),
                "unfinished": sum(1 for j in rep["jobs"] if j["jct_s"] is None),
                "utilization": util, "bound": kind_bound,
                "util_to_bound": None if not kind_bound else util / kind_bound,
                "lag_periods_max": max((s["lag_s_max"] for s in rep["services"]), default=0.0) / sc.period_s,
                "pending_s_max": _pending_max(rep, sc),
                "rescale_events": rep["rescale_events"]}
        rows.append(row)
        if progress is not None:
            progress(row)
    summary: dict = {"pairs": {}, "policies": {}}
    bound_ratios = {p: [row["jct_bound_s"] / row["policies"][p]["jct_s_mean"] for row in rows
                        if row["jct_bound_s"] and row["policies"][p]["jct_s_mean"]] for p in policies}
    summary["jct_bound_over"] = {p: {"median": float(np.median(r)), "best": float(max(r))}
                                 for p, r in bound_ratios.items() if r}
    for a in policies:
        for b in policies:
            if a == b:
                continue
            r = [row["policies"][a]["jct_s_mean"] / row["policies"][b]["jct_s_mean"] for row in rows
                 if row["policies"][b]["jct_s_mean"]]
            if r:
                summary["pairs"][f"{a}/{b}"] = {"median": float(np.median(r)), "worst": float(max(r)),
                                                "best": float(min(r))}
    for p in policies:
        ub = [row["policies"][p]["util_to_bound"] for row in rows if row["policies"][p]["util_to_bound"]]
        lag = [row["policies"][p]["lag_periods_max"] for row in rows]
        summary["policies"][p] = {
            "util_to_bound_median": float(np.median(ub)) if ub else None,
            "util_to_bound_worst": float(min(ub)) if ub else None,
            "lag_periods_median": float(np.median(lag)) if lag else 0.0,
            "lag_periods_worst": float(max(lag)) if lag else 0.0,
            "pending_s_worst": max((row["policies"][p]["pending_s_max"] for row in rows), default=0.0),
            "unfinished_jobs": sum(row["policies"][p]["unfinished"] for row in rows)}
    return {"seeds": seeds, "policies": policies, "runs": runs, "scenarios": rows, "summary": summary}
