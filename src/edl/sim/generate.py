"""Generated scenarios: clusters, services and job families drawn from stated distributions.

``draw(seed)`` returns a scenario as the YAML mapping a user would write, and
``generate(seed)`` parses it with the same parser as a file (``edl.sim.scenario.parse``), so a
generated scenario is always a valid input to the simulator. Both are pure: one
``random.Random(seed)`` and nothing else, so the same seed gives the same scenario.

The distributions (``U(a, b)`` uniform, ``U{a..b}`` uniform over whole numbers, ``{x, y}`` a uniform
choice):

- **Cluster.** ``U{40..160}`` nodes in one group (probability 0.6) or two. A group's node has
  ``{16, 17.654, 32}`` cores and ``{2, 4}`` GiB per core. With probability 0.3 the cluster has GPUs: one
  group (a quarter to a half of the nodes, at least 8) gets ``{4, 8}`` GPUs per node.
- **Services.** One or two tiers (probability 0.5 each) above every job: ``web`` (priority 1000) and
  ``api`` (500). A replica needs ``{2, 3, 4}`` cores and ``U{1..2}`` GiB per core and starts in
  ``U(1, 5)`` s. Together their peak asks ``U(0.30, 0.65)`` of the cluster's CPU (split ``U(0.4, 0.6)``
  between two tiers). Each curve is diurnal: ``peak * (low + (1 - low) * (1 + cos(2 pi (t - phase) / day)) / 2)``
  with ``low`` ``U(0.15, 0.5)``, ``day`` ``U(1200, 4000)`` s and ``phase`` ``U(0, day)``,
  stepped every ``{60, 90, 120}`` s; it is bursty: each step starts a burst with probability 0.08,
  ``U(1.3, 1.8)`` times the curve (at most 1.2 times the peak) for ``U{1..3}`` steps.
  Scheduler preemption is on with probability 0.5 (with it off, capacity for a service must be
  handed back by the policy).
- **Job families.** ``U{2..4}`` families (priority 0) of ``U{3..10}`` jobs each, the first submitted
  at ``U(0, 300)`` s, then one every ``U(10, 120)`` s. A trainer needs ``{2, 4, 5, 8}`` cores and ``{1, 2}``
  GiB per core; on a GPU cluster a family uses one GPU per trainer (probability 0.5) with ``{4, 8}``
  cores. ``min`` ``{1, 2, 2, 4}``, ``max`` ``min + U{6..40}``, ``static`` (what ``off`` runs)
  ``U(0.25, 0.6)`` of ``max`` (at least ``min``), lowered until ``static`` trainers and the fixed pods fit
  in 40 % of the CPU the services leave at their peak. Fixed pods (probability 0.7): ``U{1..6}``
  parameter servers of ``{2, 4}`` cores and 4 GiB. Scaling: ``per_trainer`` ``U(50, 200)`` samples/s,
  ``efficiency`` ``U(0.85, 0.99)`` (trainer ``k`` adds ``efficiency**(k-1)``). Work: the samples
  ``static`` trainers do in ``lognormal(ln 600 s, 0.6)`` seconds, clipped to 150..2,400 s. Rescale
  cost ``U(2, 30)`` s, start-up ``U(2, 10)`` s.
- **Horizon.** The last submission, plus the static work's CPU-seconds over 60 % of the CPU the
  services leave on average, plus three times the longest static run time, rounded up to 100 s:
  under ``off`` every job ends well inside it.
"""

from __future__ import annotations

import math
import random
from typing import Any

from edl.sim.scenario import Scenario, parse

NODE_CORES = (16.0, 17.654, 32.0)
WEB, API = 1000, 500


def _node_groups(rng: random.Random) -> list[dict[str, Any]]:
    total = rng.randint(40, 160)
    counts = [total] if rng.random() < 0.6 else [total - (k := rng.randint(total // 4, total // 2)), k]
    groups = []
    for count in counts:
        cores = rng.choice(NODE_CORES)
        groups.append({"count": count, "cpu": cores, "memory_gi": round(cores) * rng.choice((2, 4))})
    if rng.random() < 0.3:  # a GPU cluster: one group (a quarter to a half of the nodes) has GPUs
        if len(groups) == 1:
            g = groups[0]
            k = max(8, rng.randint(total // 4, total // 2))
            groups = [dict(g, count=total - k), dict(g, count=k)]
        groups[-1]["gpu"] = rng.choice((4, 8))
    return [g for g in groups if g["count"] > 0]


def _curve(rng: random.Random, peak: int, duration: float) -> list[list]:
    low = rng.uniform(0.15, 0.5)
    day = rng.uniform(1200.0, 4000.0)
    phase = rng.uniform(0, day)
    step = rng.choice((60, 90, 120))
    out, burst_left, burst = [], 0, 1.0
    t = 0.0
    while t < duration:
        base = peak * (low + (1 - low) * (1 + math.cos(2 * math.pi * (t - phase) / day)) / 2)
        if burst_left == 0 and rng.random() < 0.08:
            burst_left, burst = rng.randint(1, 3), rng.uniform(1.3, 1.8)
        n = min(base * burst, 1.2 * peak) if burst_left else base
        if burst_left:
            burst_left -= 1
        out.append([t, max(0, int(round(n)))])
        t += step
    return out


def _services(rng: random.Random, cluster_cpu: float, duration: float) -> tuple[list[dict], float, float]:
    """The service tiers, and the CPU they ask for at their peak and on average."""
    share = rng.uniform(0.30, 0.65)
    tiers = [("web", WEB)] if rng.random() < 0.5 else [("web", WEB), ("api", API)]
    split = [1.0] if len(tiers) == 1 else [(f := rng.uniform(0.4, 0.6)), 1 - f]
    services, peak_cpu, mean_cpu = [], 0.0, 0.0
    for (name, _), part in zip(tiers, split):
        cpu = float(rng.choice((2, 3, 4)))
        pod = {"cpu": cpu, "memory_gi": cpu * rng.randint(1, 2)}
        peak = max(1, int(share * part * cluster_cpu / cpu))
        replicas = _curve(rng, peak, duration)
        services.append({"name": name, "priority": name, "pod": pod, "startup_s": round(rng.uniform(1, 5), 1),
                         "replicas": replicas})
        peak_cpu += cpu * max(n for _, n in replicas)
        mean_cpu += cpu * sum(n for _, n in replicas) / len(replicas)
    return services, peak_cpu, mean_cpu


def _throughput(per: float, eff: float, n: int) -> float:
    return sum(per * eff ** k for k in range(n))


def _family(rng: random.Random, index: int, gpu_nodes: bool, room_cpu: float, node_cpu: float) -> dict[str, Any]:
    gpu = gpu_nodes and rng.random() < 0.5
    cpu = float(rng.choice((4, 8)) if gpu else rng.choice((2, 4, 5, 8)))
    cpu = min(cpu, math.floor(node_cpu))
    trainer = {"cpu": cpu, "memory_gi": cpu * rng.choice((1, 2)), **({"gpu": 1} if gpu else {})}
    lo = rng.choice((1, 2, 2, 4))
    hi = lo + rng.randint(6, 40)
    fixed: list[dict[str, Any]] = []
    if rng.random() < 0.7:
        fixed = [{"role": "pserver", "count": rng.randint(1, 6), "cpu": float(rng.choice((2, 4))), "memory_gi": 4}]
    fixed_cpu = sum(f["count"] * f["cpu"] for f in fixed)
    static = max(lo, int(round(rng.uniform(0.25, 0.6) * hi)))
    while static > lo and static * cpu + fixed_cpu > 0.4 * room_cpu:
        static -= 1
    per, eff = rng.uniform(50, 200), rng.uniform(0.85, 0.99)
    runtime = min(2400.0, max(150.0, rng.lognormvariate(math.log(600), 0.6)))
    return {
        "name": f"f{index}", "count": rng.randint(3, 10), "submit_at": round(rng.uniform(0, 300)),
        "submit_every": round(rng.uniform(10, 120)), "priority": "batch",
        **({"fixed_pods": fixed} if fixed else {}),
        "trainer": trainer, "min": lo, "max": hi, "static": static,
        "work": float(round(_throughput(per, eff, static) * runtime)),
        "throughput": {"per_trainer": round(per, 1), "efficiency": round(eff, 3)},
        "rescale_cost_s": round(rng.uniform(2, 30), 1), "startup_s": round(rng.uniform(2, 10), 1),
    }


def draw(seed: int) -> dict[str, Any]:
    """The scenario of ``seed`` as a YAML mapping (see the module docstring for the distributions)."""
    rng = random.Random(seed)
    nodes = _node_groups(rng)
    cluster_cpu = sum(g["count"] * g["cpu"] for g in nodes)
    gpu_nodes = any(g.get("gpu") for g in nodes)
    smallest_node = min(g["cpu"] for g in nodes)
    # The horizon depends on the jobs, and the jobs' sizes on the services' peak: draw the
    # curves over a long horizon first and cut them at the end.
    services, peak_cpu, mean_cpu = _services(rng, cluster_cpu, 20_000.0)
    room = max(0.2 * cluster_cpu, cluster_cpu - peak_cpu)
    families = [_family(rng, i, gpu_nodes, room, smallest_node) for i in range(rng.randint(2, 4))]
    last_submit = max(f["submit_at"] + (f["count"] - 1) * f["submit_every"] for f in families)
    static_cpu_s = 0.0
    longest = 0.0
    for f in families:
        per, eff = f["throughput"]["per_trainer"], f["throughput"]["efficiency"]
        run_s = f["work"] / _throughput(per, eff, f["static"])
        longest = max(longest, run_s)
        cpu = f["static"] * f["trainer"]["cpu"] + sum(p["count"] * p["cpu"] for p in f.get("fixed_pods", []))
        static_cpu_s += f["count"] * cpu * run_s
    drain = static_cpu_s / (0.6 * max(0.2 * cluster_cpu, cluster_cpu - mean_cpu))
    duration = float(100 * math.ceil((last_submit + drain + 3 * longest) / 100))
    for s in services:
        s["replicas"] = [r for r in s["replicas"] if r[0] < duration]
    priorities = {"web": WEB, "batch": 0, **({"api": API} if any(s["name"] == "api" for s in services) else {})}
    return {
        "name": f"generated-{seed}", "duration_s": duration, "period_s": 5,
        "preemption": rng.random() < 0.5, "nodes": nodes, "priorities": priorities,
        "services": services, "jobs": families,
    }


def generate(seed: int) -> Scenario:
    """The scenario of ``seed``, validated as a scenario file would be."""
    sc = parse(draw(seed), f"generated scenario {seed}")
    sc.meta["seed"] = seed
    return sc
