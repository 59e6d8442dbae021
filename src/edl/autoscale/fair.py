"""``edl``: our policy. Priorities first, then proportional fairness, with hysteresis.

1. What must run comes first, by strict priority: tier by tier (descending),
   pods waiting for a node that are not our trainers (a service scaling up)
   are placed, then every elastic job of the tier gets its min. Capacity held by
   lower-priority trainers is therefore handed back in the same decision that
   sees the higher-priority demand: within one period.
2. Spare capacity is shared fairly, and where it speeds things up most: the
   next trainer goes to the job with the largest weighted gain in log
   throughput, ``w * (log T(n+1) - log T(n))``. This maximises the weighted sum
   of log throughputs (weighted proportional fairness, the idea behind Pollux's
   goodput fairness): with no measured curves, equal-priority jobs get equal
   trainer counts and each priority level above doubles a job's share; with
   curves, a job that stops scaling stops getting trainers.
3. No thrash: growth must pay for itself: the throughput gained over a horizon
   must exceed what the rescale pause costs (measured ``rescale_cost_s``); ties
   favour the job that already holds the trainer, so equal shares stay put.
4. Real placement: every trainer is bound to a node that can hold it (best fit
   on CPU, memory and GPU), so the plan never exceeds what the cluster holds.
"""

from __future__ import annotations

import heapq
import math

from edl.autoscale.accounting import Capacity, capacity
from edl.autoscale.model import JobDemand, Pod, Snapshot


def log_gain(j: JobDemand, n: int) -> float:
    """The gain in log throughput from trainer n+1."""
    a, b = j.speed(n), j.speed(n + 1)
    if b <= 0:
        return -math.inf
    if a <= 0:
        return math.inf
    return math.log(b / a)


def scaling_exponent(j: JobDemand, n: int) -> float:
    """``p`` of a power-law fit ``T(n) ~ n**p`` around ``n`` trainers (1: linear, 0: no gain)."""
    n = max(1, n)
    a, b = j.speed(n), j.speed(2 * n)
    if a <= 0 or b <= a:
        return 0.0
    return min(1.0, math.log(b / a) / math.log(2))


def completion_weights(jobs: list[JobDemand]) -> dict[str, float]:
    """heSRPT shares (Berg et al., 2020): the split of a shared pool that minimises mean
    completion time for jobs with speed-up ``n**p``.

    With the jobs ordered from most to least remaining time, job ``i`` of ``m`` gets
    ``(i/m)**c - ((i-1)/m)**c`` of the pool, ``c = 1/(1-p)``: shorter jobs get more, yet
    every job keeps a share (pure shortest-first wastes the concave part of the curves).
    The shares become proportional-fairness weights (that greedy split gives shares
    proportional to weights), normalised to a mean of 1. ``p`` is fitted from the jobs'
    own curves at an even split and capped at 0.9 so that no job is starved outright.
    """
    if len(jobs) < 2:
        return {j.name: 1.0 for j in jobs}
    even = max(1, sum(j.current for j in jobs) // len(jobs))
    p = min(0.9, max(0.0, sum(scaling_exponent(j, even) for j in jobs) / len(jobs)))
    c = 1.0 / (1.0 - p)
    m = len(jobs)
    order = completion_order(jobs)
    share = {j.name: (i / m) ** c - ((i - 1) / m) ** c for i, j in enumerate(order, start=1)}
    return {name: max(s * m, 1e-3) for name, s in share.items()}


def completion_order(jobs: list[JobDemand]) -> list[JobDemand]:
    """Most remaining time first: the order heSRPT shares follow.

    Remaining time is taken at the job's own size or an even split, whichever is larger:
    a job that holds many trainers keeps its rank (no flip-flop between near-equal jobs,
    each flip costs both a pause), while a newcomer is judged by what it would get. The
    name breaks ties so that every sidecar computes the same order.
    """
    even = max(1, sum(j.current for j in jobs) // max(1, len(jobs)))
    return sorted(jobs, key=lambda j: (-(j.remaining or 0.0) / max(j.speed(max(j.current, even)), 1e-9), j.name))


class EdlPolicy:
    name = "edl"

    def __init__(self, horizon_s: float = 120.0, band: int = 1) -> None:
        self.horizon_s = horizon_s
        self.band = band

    def decide(self, snapshot: Snapshot) -> dict[str, int]:
        planned = frozenset(j.name for j in snapshot.jobs)
        # Everything but the trainers we are planning counts as load; pods still waiting for a
        # node are placed below, by priority.
        pending: list[Pod] = []
        cap = capacity(snapshot, planned, pending)
        tiers = sorted({j.priority for j in snapshot.jobs} | {p.priority for p in pending}, reverse=True)
        alloc = {j.name: 0 for j in snapshot.jobs}
        # Strict priority for what must run: waiting pods and every job's minimum, tier by tier.
        for tier in tiers:
            for p in sorted((p for p in pending if p.priority == tier), key=lambda p: p.name):
                cap.place(p.requests)  # a pod that fits nowhere stays pending either way
            for j in sorted((j for j in snapshot.jobs if j.priority == tier), key=lambda j: j.name):
                self._place_min(cap, j, alloc)
        after_min = cap.copy()
        floor = dict(alloc)
        self._grow(cap, sorted(snapshot.jobs, key=lambda j: j.name), alloc, self.weights(snapshot.jobs))
        plan = {j.name: self._settle(j, alloc[j.name]) for j in snapshot.jobs}
        return self._stick(snapshot.jobs, plan, floor, after_min)

    def _stick(self, jobs: tuple[JobDemand, ...], plan: dict[str, int], floor: dict[str, int],
               cap: Capacity) -> dict[str, int]:
        """Hysteresis: a job whose fair share fell by one keeps its current size if it still fits.

        Without it, shares that differ by one trainer flip between jobs as the cluster breathes,
        and every flip costs both jobs a pause. Forced shrinks (the trainers no longer fit, e.g.
        a higher-priority pod waits) and larger moves go through.
        """
        target = {}
        for j in sorted(jobs, key=lambda j: (-j.priority, j.name)):
            want = plan[j.name]
            if 0 < j.current - want <= self.band and j.min <= j.current <= j.max:
                want = j.current  # a voluntary shrink by one: keep the trainer if it still fits
            target[j.name] = want
        if target == plan:
            return target  # nothing kept beyond the plan, which was placed trainer by trainer already
        # Verify on a copy of the cluster that the sticky plan fits; fall back per job if not.
        for j in sorted(jobs, key=lambda j: (-j.priority, j.name)):
            have = floor.get(j.name, 0)
            while have < target[j.name] and cap.place(j.trainer) is not None:
                have += 1
            if have < target[j.name]:
                target[j.name] = max(min(plan[j.name], have) if have >= j.min else j.min, j.min)
        return target

    @staticmethod
    def remaining_key(jobs: tuple[JobDemand, ...]) -> tuple:
        """All this policy reads of the jobs' remaining work: the completion order per priority
        level. Two snapshots that differ only in remaining work but share this key get the same plan."""
        levels = sorted({j.priority for j in jobs})
        return tuple((level, tuple(j.name for j in completion_order(
            [j for j in jobs if j.priority == level and j.remaining is not None]))) for level in levels)

    @staticmethod
    def weights(jobs: tuple[JobDemand, ...]) -> dict[str, float]:
        """Each priority level doubles a job's weight; within a level, jobs that know their
        remaining work are weighted for the least mean completion time (see ``completion_weights``)."""
        levels = sorted({j.priority for j in jobs})
        out = {j.name: float(2 ** levels.index(j.priority)) for j in jobs}
        for level in levels:
            finite = [j for j in jobs if j.priority == level and j.remaining is not None]
            for name, w in completion_weights(finite).items():
                out[name] *= w
        return out

    @staticmethod
    def _place_min(cap: Capacity, j: JobDemand, alloc: dict[str, int]) -> None:
        placed = []
        for _ in range(j.min):
            node = cap.place(j.trainer)
            if node is None:
                break
            placed.append(node)
        if len(placed) < j.min:
            for node in placed:  # all or nothing: a partial minimum helps nobody
                cap.release(node, j.trainer)
        else:
            alloc[j.name] = j.min

    @staticmethod
    def _grow(cap: Capacity, jobs: list[JobDemand], alloc: dict[str, int], weight: dict[str, float]) -> None:
        heap: list[tuple[float, int, str]] = []
        by_name = {j.name: j for j in jobs}

        def push(j: JobDemand) -> None:
            n = alloc[j.name]
            if j.min <= n < j.max and n > 0:
                # Larger weighted gain first; on a tie the job that already holds the trainer keeps it.
                heapq.heappush(heap, (-weight[j.name] * log_gain(j, n), 0 if j.current > n else 1, j.name))

        for j in jobs:
            push(j)
        while heap:
            _, _, name = heapq.heappop(heap)
            j = by_name[name]
            if cap.place(j.trainer) is None:
                continue  # no node holds another trainer of this shape
            alloc[name] += 1
            push(j)

    def _settle(self, j: JobDemand, fair: int) -> int:
        """Apply hysteresis: shrink at once; grow only when the gain pays for the pause."""
        fair = min(fair, j.max)
        if fair < j.min:
            return j.min  # its minimum does not fit: it waits, as pending pods do
        if fair <= j.current:
            return fair  # shrinking hands capacity back now
        if j.rescale_cost_s > 0 and j.current >= 1:
            horizon = self.horizon_s
            if j.remaining is not None and j.speed(j.current) > 0:
                horizon = min(horizon, j.remaining / j.speed(j.current))  # no gain after the job is done
            gained = (j.speed(fair) - j.speed(j.current)) * horizon
            lost = j.speed(j.current) * j.rescale_cost_s
            if gained <= lost:
                return max(j.current, j.min)
        return fair
