"""An upper bound on a scenario's CPU utilization: the best packing any policy could reach.

At every instant the pods that may exist are known from the scenario alone: each
service's target replicas, the fixed pods of every submitted job and up to ``max``
trainers per elastic job (``static`` under policy ``off``). Packing them into the
nodes is a bin-packing problem; we solve it exactly as a small integer program
over *node configurations* (how many pods of each shape one node holds), so the
bound counts the capacity that whole pods can never fill (a 17.654-core node
holds at most 15 cores of 5-core trainers). Start-up latency, rescale pauses and
job completion are ignored, which only makes the bound looser (higher).

It answers "is this utilization target reachable at all?" and is reported next
to the measured utilization so that a policy is judged against what is possible.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from edl.api.cluster import Resources
from edl.errors import UserError
from edl.sim.engine import PlacedInstant
from edl.sim.scenario import Scenario

EPS = 1e-9
MAX_CONFIGS = 20_000


def configurations(node: Resources, shapes: tuple[Resources, ...]) -> list[tuple[int, ...]]:
    """Every multiset of pod shapes that fits on one node (counts per shape)."""
    out: list[tuple[int, ...]] = []

    def walk(i: int, free: Resources, counts: list[int]) -> None:
        if len(out) > MAX_CONFIGS:
            raise UserError(f"utilization bound: more than {MAX_CONFIGS} node configurations; "
                            "the pods are too small for the nodes to enumerate")
        if i == len(shapes):
            out.append(tuple(counts))
            return
        s, k = shapes[i], 0
        while True:
            counts.append(k)
            walk(i + 1, free, counts)
            counts.pop()
            free = free - s
            if not (free.cpu >= -EPS and free.memory >= -EPS and free.gpu >= -EPS) or s == Resources():
                break
            k += 1

    walk(0, node, [])
    return out


class PackingBound:
    """Maximum CPU requested by pods that fit, for a given demand per pod shape.

    ``nodes``: per group of identical nodes, how many and what each has free for the pods."""

    def __init__(self, nodes: list[tuple[int, Resources]], shapes: tuple[Resources, ...],
                 relaxed: bool = False) -> None:
        self.shapes = shapes
        # The linear relaxation (configurations used fractionally) is still an upper bound, looser
        # but tens of times faster where nodes hold thousands of configurations.
        self.relaxed = relaxed
        self.groups = [(count, configurations(free, shapes)) for count, free in nodes]
        self.total_cpu = sum(count * free.cpu for count, free in nodes)

    @lru_cache(maxsize=4096)
    def best_cpu(self, demand: tuple[int, ...]) -> float:
        cols, cpu = [], []
        rows_group = []
        for gi, (_, confs) in enumerate(self.groups):
            for conf in confs:
                cols.append(conf)
                cpu.append(sum(n * s.cpu for n, s in zip(conf, self.shapes)))
                rows_group.append(gi)
        n = len(cols)
        a_shape = np.array(cols, dtype=float).T  # shapes x configurations
        a_group = np.zeros((len(self.groups), n))
        a_group[rows_group, np.arange(n)] = 1.0
        res = milp(c=-np.array(cpu), integrality=np.zeros(n) if self.relaxed else np.ones(n),
                   bounds=Bounds(0, np.inf),
                   constraints=[LinearConstraint(a_shape, 0, np.array(demand, dtype=float)),
                                LinearConstraint(a_group, 0, np.array([c for c, _ in self.groups], dtype=float))])
        if not res.success:  # pragma: no cover - the all-zero packing is always feasible
            raise RuntimeError(f"utilization bound: solver failed: {res.message}")
        return float(-res.fun)


def utilization_bound(scenario: Scenario, policy: str, relaxed: bool = False, step_s: float | None = None) -> dict:
    """Upper bounds on mean and off-peak utilization, sampled as the simulator samples (or every
    ``step_s``, an estimate of the same mean that solves fewer packings)."""
    shapes = sorted({s.pod for s in scenario.services} | {f.pod for j in scenario.jobs for f in j.fixed_pods}
                    | {j.trainer for j in scenario.jobs}, key=lambda r: (r.cpu, r.memory, r.gpu))
    shapes_t = tuple(shapes)
    index = {s: i for i, s in enumerate(shapes_t)}
    bound = PackingBound([(g.count, g.allocatable) for g in scenario.nodes], shapes_t, relaxed)
    dt = step_s or scenario.tick_s
    steps = int(round(scenario.duration_s / dt))
    values, offpeak = [], []
    for k in range(steps):
        t = k * dt
        demand = [0] * len(shapes_t)
        for s in scenario.services:
            demand[index[s.pod]] += s.target(t)
        for j in scenario.jobs:
            if t < j.submit_at:
                continue
            for f in j.fixed_pods:
                demand[index[f.pod]] += f.count
            demand[index[j.trainer]] += j.static if policy == "off" else j.max
        u = bound.best_cpu(tuple(demand)) / bound.total_cpu
        values.append(u)
        if scenario.offpeak and scenario.offpeak[0] <= t <= scenario.offpeak[1]:
            offpeak.append(u)
    return {"mean": float(np.mean(values)) if values else 0.0,
            "offpeak_mean": float(np.mean(offpeak)) if offpeak else None}


def placed_bound(instants: Sequence[PlacedInstant], total_cpu: float,
                 offpeak: tuple[float, float] | None = None) -> dict:
    """Upper bounds on mean and off-peak utilization when some pods stay where a run put them.

    At each instant the pods kept (``PlacedInstant.kept_cpu``) count as they are, and the movable
    pods are packed exactly into what they leave on each node (the integer program of
    ``PackingBound``, over the distinct free capacities). With the services' and fixed pods kept,
    this is the most a policy that places only its trainers could reach around what the scheduler did
    in this run; it depends on the run, as those pods went where the trainers left room."""
    cache: dict[tuple, float] = {}
    values, offpeak_values = [], []
    for inst in instants:
        key = (inst.free, inst.movable)
        best = cache.get(key)
        if best is None:
            if inst.movable:
                shapes = tuple(s for s, _ in inst.movable)
                best = PackingBound([(n, free) for free, n in inst.free], shapes).best_cpu(
                    tuple(n for _, n in inst.movable))
            else:
                best = 0.0
            cache[key] = best
        u = (inst.kept_cpu + best) / total_cpu
        values.append(u)
        if offpeak and offpeak[0] <= inst.t <= offpeak[1]:
            offpeak_values.append(u)
    return {"mean": float(np.mean(values)) if values else 0.0,
            "offpeak_mean": float(np.mean(offpeak_values)) if offpeak_values else None}


def jct_lower_bound(scenario: Scenario) -> float | None:
    """A lower bound on any policy's mean job completion time: every finite job alone on the
    cluster at its ``max`` trainers from the moment it is submitted (no start-up, no pause, no
    other job). ``None`` when the scenario has no finite job.

    The distance from a policy's mean JCT to this bound is what contention, start-up and rescale
    pauses cost together; on a cluster where every job fits at its ``max`` at once, a policy that
    grows each job to its ``max`` comes within start-up of it.
    """
    times = [j.work / j.throughput(j.max) for j in scenario.jobs if j.work is not None and j.throughput(j.max) > 0]
    return float(np.mean(times)) if times else None
