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
3. No thrash, because every rescale pauses a job (measured ``rescale_cost_s``):
   a trainer a job holds counts ``keep_bonus`` (1.5x) more than one it would
   gain; a running job's change of size is charged its pause in the fair
   shares themselves (a step must gain more log throughput than the pause costs
   over the horizon, and the best step per trainer is taken whole, so freed
   capacity goes to few jobs in large steps); a job grows only when the
   throughput gained over the time it has left beats its pause; it gives
   trainers up voluntarily only when the move pays for two pauses (its own and
   the receiver's), and never for one trainer. Forced shrinks (higher-priority
   demand, minimums) always go through, and only those the cluster as it is
   needs: the sizes are what the placement holds (``plan``), not what a packing
   from scratch fits.
4. Real placement: every trainer is bound to a node that can hold it (best fit
   on CPU, memory and GPU), so the plan never exceeds what the cluster holds.
5. The plan says where new trainers go (``plan``): the trainers a job holds stay
   where they are, the new ones go best fit into what is left after every pod
   the policy knows of (fixed pods, services, waiting higher-priority pods). The
   launcher turns each into a preferred node affinity: the scheduler packs
   trainers as the sizes assumed instead of spreading them into fragments.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from typing import Callable

from edl.autoscale.accounting import EPS, Capacity, capacity
from edl.api.cluster import JobDemand, Pod, Resources, SizeCause, SizeReason, Snapshot
from edl.api.policy import Plan
from edl.autoscale.reasons import fits, job_of, plain, shrunk_or_full


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


ORDER_TOLERANCE = 1.25  # remaining times in one band of 25 % rank by size held, not by time


def completion_order(jobs: list[JobDemand]) -> list[JobDemand]:
    """Most remaining time first: the order heSRPT shares follow.

    Remaining time is taken at the job's own size or an even split, whichever is larger:
    a job that holds many trainers keeps its rank, while a newcomer is judged by what it
    would get. Times within ``ORDER_TOLERANCE`` of each other count as equal, and then the
    job that holds more trainers ranks as the shorter one: near-equal jobs (two submitted
    moments apart) would otherwise trade places with every step of progress, and each
    trade costs both a pause. The name breaks the remaining ties so that every sidecar
    computes the same order.
    """
    even = max(1, sum(j.current for j in jobs) // max(1, len(jobs)))

    def key(j: JobDemand) -> tuple:
        t = (j.remaining or 0.0) / max(j.speed(max(j.current, even)), 1e-9)
        return -math.floor(math.log(max(t, 1e-9)) / math.log(ORDER_TOLERANCE)), j.current, j.name

    return sorted(jobs, key=key)


class EdlPolicy:
    name = "edl"

    def __init__(self, horizon_s: float = 120.0, band: int = 1, keep_bonus: float = 1.5) -> None:
        self.horizon_s = horizon_s
        self.band = band
        # A trainer a job already holds counts this much more than one it would gain: another job
        # takes it only for a clearly larger gain. Without it, leftover trainers wander between
        # jobs of near-equal value at every arrival and completion, and each move costs two pauses.
        # With 1.5, equal jobs stay within about 1.5x (+1) of each other (seed-case1: Jain 0.98).
        self.keep_bonus = keep_bonus

    def decide(self, snapshot: Snapshot) -> dict[str, int]:
        return self.plan(snapshot).sizes

    def plan(self, snapshot: Snapshot) -> Plan:
        pending: list[Pod] = []
        bound: dict[str, list[str]] = {}
        shapes: set[float] = set()
        running: set[str] = set()
        cap = capacity(snapshot, frozenset(j.name for j in snapshot.jobs), pending, bound, shapes, running)
        base = cap.copy()
        sizes, keep, startable = self._sizes(snapshot, cap, pending, running)
        fixed: dict[str, str] = {}
        nodes = self._placement(snapshot.jobs, sizes, base, pending, bound, shapes, fixed, keep, startable)
        sizes = self._as_placed(snapshot.jobs, sizes, keep, nodes)
        return Plan(sizes, self._trimmed(nodes, sizes, bound), fixed)

    def explain(self, snapshot: Snapshot, plan: Plan, job: str) -> SizeReason:
        """Why ``plan`` gives ``job`` its size, with the numbers this policy weighed."""
        j = job_of(snapshot, job)
        size = plan.sizes.get(job, j.current)
        reason = plain(j, size, snapshot)
        room = None
        if reason is None and size == j.current:
            room = fits(snapshot, j, size + 1)  # one capacity pass, read again below
            if room and not self._grows(j, size + 1):
                reason = self._not_worth(j, size + 1)
        reason = reason or shrunk_or_full(j, size, snapshot, plan, room)
        if reason is not None:
            return reason
        # Room, a growth that pays, and no other taker: the decision keeps the job until the next one.
        return SizeReason(SizeCause.SHARED, f"stays at {size}: the room goes to the jobs placed first")

    def _grows(self, j: JobDemand, n: int) -> bool:
        """Whether growing ``j`` to ``n`` pays for its pause by both of this policy's tests: the share's
        (``_grow``: the gain in log throughput net of the pause over the horizon) and the settling's."""
        if j.rescale_cost_s <= 0 or j.current < 1:
            return True
        frac = j.rescale_cost_s / self.horizon_s
        if frac >= 1 or j.speed(j.current) <= 0 or j.speed(n) <= 0:
            return False
        net = math.log(j.speed(n)) - math.log(j.speed(j.current)) + math.log(1 - frac)
        return net > 0 and self._pays_to_grow(j, n)

    def _not_worth(self, j: JobDemand, n: int) -> SizeReason:
        now, then, horizon = j.speed(j.current), j.speed(n), self._horizon(j)
        return SizeReason(SizeCause.NOT_WORTH_PAUSE,
                          f"growth {j.current} -> {n} not worth its pause: {then - now:+.0f} rows/s "
                          f"({now:.0f} -> {then:.0f}) over the {horizon:.0f} s that count "
                          f"against {now * j.rescale_cost_s:.0f} rows lost in a {j.rescale_cost_s:.1f} s pause")

    @staticmethod
    def _trimmed(nodes: dict[str, tuple[str, ...]], sizes: dict[str, int],
                 bound: dict[str, list[str]]) -> dict[str, tuple[str, ...]]:
        """At most one node per trainer of a job's size (``Plan.nodes``): where a growth the placement
        found room for is not made, its new nodes go, the nodes the job's trainers run on stay."""
        out = dict(nodes)
        for name, planned in nodes.items():
            extra = len(planned) - sizes.get(name, 0)
            if extra <= 0:
                continue
            running = Counter(bound.get(name, ()))
            new = list((Counter(planned) - running).elements())
            drop = Counter(new[:extra]) + Counter(list(running.elements())[:max(0, extra - len(new))])
            out[name] = tuple(sorted((Counter(planned) - drop).elements()))
        return out

    def _as_placed(self, jobs: tuple[JobDemand, ...], sizes: dict[str, int], keep: dict[str, int],
                   nodes: dict[str, tuple[str, ...]]) -> dict[str, int]:
        """The sizes as the cluster holds them. The sizing packs every trainer from scratch, which can
        fit fewer than where they run: a job it shrank by force keeps what the placement kept where it
        runs (up to ``keep``, what it would keep but for room). A job that grows gets what the placement
        found room for (not less than it has): trainers asked for beyond that would wait for a node, and
        each one that starts later pauses the job again. A partial growth that does not pay is not made."""
        out = dict(sizes)
        for j in jobs:
            n, placed = sizes.get(j.name, 0), len(nodes.get(j.name, ()))
            have = max(j.current, j.min)
            if n > have and placed > have:
                out[j.name] = n if placed >= n else placed if self._pays_to_grow(j, placed) else have
            else:
                out[j.name] = max(j.min, min(placed, max(n, keep.get(j.name, 0))))
        return out

    @staticmethod
    def _placement(jobs: tuple[JobDemand, ...], sizes: dict[str, int], cap: Capacity, pending: list[Pod],
                   bound: dict[str, list[str]], shapes: set[float] | frozenset[float] = frozenset(),
                   fixed: dict[str, str] | None = None, keep: dict[str, int] | None = None,
                   startable: frozenset[str] = frozenset()) -> dict[str, tuple[str, ...]]:
        """Where each job's trainers go: those it holds stay (up to its size), then, tier by tier,
        the pods waiting for a node are placed, a new job's minimum goes best fit, a job the sizing
        shrank below ``keep`` (what it keeps but for room) takes back the nodes it gave up where they
        still have room (unless a higher-priority pod waits that the cluster as it is has no room
        for), and the new trainers go best fit into what is left.
        A job's own waiting pods (``fixed``, by pod name) go where they leave the least room that
        the jobs' pods cannot fill (``Capacity.place_packed``); other pods best fit, as the
        scheduler's spreading is not ours to steer. For a job whose minimum the sizing fits
        (``startable``), its minimum and its own waiting pods may take its level's trainers above
        their minimum, all of the minimum or none.

        Best fit on the cluster as it is, not as the sizing saw it (that one re-placed every
        trainer from scratch): a new trainer that fits nowhere now gets no node (the scheduler
        alone places it, or it waits for a drain to free room)."""
        index = {n: i for i, n in enumerate(cap.names)}
        by_job = {j.name: j for j in jobs}
        # Every trainer where it is bound, to begin with; a job that shrinks has ``surplus`` of them to give up.
        held = {j.name: sorted(n for n in bound.get(j.name, ()) if n in index) for j in jobs}
        for name, nodes in held.items():
            for n in nodes:
                cap.take(index[n], by_job[name].trainer)
        surplus = {name: len(nodes) - sizes.get(name, 0) for name, nodes in held.items()}
        forced = dict.fromkeys(held, 0)  # trainers given up for a waiting pod beyond what a job gives up

        def give_up(name: str, node: str) -> None:
            held[name].remove(node)
            surplus[name] -= 1
            cap.release(index[node], by_job[name].trainer)

        def make_room(req: Resources, below: int, own: str | None, force: bool = False,
                      only: int | None = None) -> int | None:
            """The node where the fewest trainers that go anyway (of jobs that shrink, below priority
            ``below`` or the pod's own job) leave room for ``req``: those are the ones given up. The
            waiting pod then has room in the plan's own count, not only in total. With ``force``, the
            trainers of lower-priority jobs above their minimum may go too (the fewest such first): the
            sizing packs from scratch and can find room that the cluster as it is does not have. A
            caller passing ``below`` one above its own level lets its level's jobs give up trainers
            too (a minimum, which must run). ``only``: that node alone (the one the scheduler nominated)."""
            on: dict[int, list[str]] = {}
            allowed = cap.eligible.get(own) if own is not None else None  # a trainer's own selector
            budget0 = {name: surplus[name] if not force or by_job[name].priority >= below else
                       max(surplus[name], len(nodes) - by_job[name].min) for name, nodes in held.items()}
            for name, nodes in held.items():
                if budget0[name] > 0 and (by_job[name].priority < below or name == own):
                    for n in nodes:
                        if (allowed is None or index[n] in allowed) and (only is None or index[n] == only):
                            on.setdefault(index[n], []).append(name)
            best: tuple[int, int, float, int, list[str]] | None = None
            for i, names in on.items():
                cpu, mem, gpu, going, taken = cap.free_cpu[i], cap.free_mem[i], cap.free_gpu[i], [], 0
                budget = dict(budget0)
                for name in sorted(names, key=lambda name: (surplus[name] <= 0, -by_job[name].trainer.cpu, name)):
                    if cpu + EPS >= req.cpu and mem + EPS >= req.memory and gpu + EPS >= req.gpu:
                        break
                    if budget[name] > 0:
                        budget[name] -= 1
                        taken += budget0[name] - budget[name] > surplus[name]  # beyond what it gives up
                        t = by_job[name].trainer
                        cpu, mem, gpu = cpu + t.cpu, mem + t.memory, gpu + t.gpu
                        going.append(name)
                if cpu + EPS >= req.cpu and mem + EPS >= req.memory and gpu + EPS >= req.gpu:
                    key = (taken, len(going), cpu - req.cpu, i, going)
                    if best is None or key[:4] < best[:4]:
                        best = key
            if best is None:
                return None
            i, going = best[3], best[4]
            for name in going:
                if surplus[name] <= 0:
                    forced[name] += 1
                give_up(name, cap.names[i])
            cap.take(i, req)
            return i

        out: dict[str, tuple[str, ...]] = {}
        # Less CPU than the smallest pod the policy knows of is lost to every pod: best fit avoids
        # leaving that where a near-best node would not.
        smallest = min((c for c in (*(j.trainer.cpu for j in jobs), *shapes, *(p.requests.cpu for p in pending))
                        if c > 0), default=0.0)
        fill = sorted({*(j.trainer.cpu for j in jobs), *shapes})
        # The highest level with a waiting pod that the cluster as it is has no room for (room was made,
        # or none found): below it, the room trainers free is the scheduler's to hand out.
        squeezed = -math.inf
        for tier in sorted({j.priority for j in jobs} | {p.priority for p in pending}, reverse=True):
            tier_jobs = sorted((j for j in jobs if j.priority == tier), key=lambda j: j.name)
            # What the jobs of this level still give up (the waiting pods above took what they needed):
            # the trainers on the emptiest nodes (the launcher drains those the plan does not keep). What
            # they free comes as whole nodes' worth of room where the cluster is already sparse, which is
            # where the scheduler's spreading sends the next pods, rather than as holes in packed nodes;
            # and it is free for this level's own waiting pods (a new job's fixed pods).
            given: dict[str, list[str]] = {}
            for j in tier_jobs:
                for n in sorted(held[j.name], key=lambda n: (-cap.free_cpu[index[n]], n))[:max(0, surplus[j.name])]:
                    give_up(j.name, n)
                    given.setdefault(j.name, []).append(n)
            for p in sorted((p for p in pending if p.priority == tier), key=lambda p: p.name):
                # Where the scheduler preempted for it, it goes: the trainers there are the ones that go.
                i = cap.place_nominated(p)
                if i is None and (at := cap.node_index(p.nominated or "")) is not None:
                    squeezed = max(squeezed, p.priority)
                    # The scheduler's victims go whatever the sizing kept of their jobs: force.
                    i = make_room(p.requests, p.priority, p.job, force=True, only=at)
                if i is None:
                    i = cap.place_spread(p.requests) if p.job is None else cap.place_packed(p.requests, fill)
                if i is None:
                    squeezed = max(squeezed, p.priority)
                    i = make_room(p.requests, p.priority, p.job)
                if i is None and (p.job is None or p.job in startable):
                    # What must run: a service's pod takes from lower levels' trainers above their
                    # minimum; the pod of a job that can start (part of what it needs to run at all)
                    # from its level's too.
                    below = p.priority if p.job is None else p.priority + 1
                    i = make_room(p.requests, below, p.job, force=True)
                if i is not None and p.job is not None and fixed is not None:
                    fixed[p.name] = cap.names[i]
            new: dict[str, list[str]] = {}
            for j in tier_jobs:  # a job's minimum comes before what others keep
                need = min(j.min, sizes.get(j.name, 0)) - len(held[j.name])
                new[j.name] = [cap.names[i] for i in cap.place_many(j.trainer, need, smallest, j.name)]
                while len(new[j.name]) < need and (i := make_room(j.trainer, j.priority, j.name)) is not None:
                    new[j.name].append(cap.names[i])
                if len(new[j.name]) < need and j.name in startable:
                    # A minimum is what must run: where the cluster as it is has no room for it (the
                    # sizing packs from scratch and finds some), trainers of this level's jobs above their
                    # minimum go; all of the minimum or none (a part of it runs nothing).
                    saved, placed = cap.saved(), len(new[j.name])
                    held_before = {n: list(v) for n, v in held.items()}
                    surplus_before, forced_before = dict(surplus), dict(forced)
                    while len(new[j.name]) < need and (i := make_room(j.trainer, j.priority + 1, j.name,
                                                                      force=True)) is not None:
                        new[j.name].append(cap.names[i])
                    if len(new[j.name]) < need:  # not all of it: give back what was taken for it
                        cap.restore(saved)
                        held.update(held_before)
                        surplus.update(surplus_before)
                        forced.update(forced_before)
                        del new[j.name][placed:]
            for j in tier_jobs:  # trainers shrunk by the sizing's packing alone stay where they run
                if j.priority < squeezed:
                    continue  # the room the waiting pods get is the scheduler's to choose: leave it all
                t = j.trainer
                for n in reversed(given.get(j.name, [])):  # the fullest first
                    if len(held[j.name]) >= (keep or {}).get(j.name, 0):
                        break
                    i = index[n]
                    if cap.free_cpu[i] + EPS >= t.cpu and cap.free_mem[i] + EPS >= t.memory and cap.free_gpu[i] + EPS >= t.gpu:
                        cap.take(i, t)
                        held[j.name].append(n)
                        surplus[j.name] += 1
            for j in tier_jobs:
                want = sizes.get(j.name, 0) - forced[j.name] - len(held[j.name])
                nodes = new[j.name]  # extended in place
                nodes += [cap.names[i] for i in cap.place_many(j.trainer, want - len(nodes), smallest, j.name)]
                while len(nodes) < want and (i := make_room(j.trainer, j.priority, j.name)) is not None:
                    nodes.append(cap.names[i])
                out[j.name] = tuple(sorted((*held[j.name], *nodes)))
        return out

    def _sizes(self, snapshot: Snapshot, cap: Capacity, pending: list[Pod],
               running: set[str]) -> tuple[dict[str, int], dict[str, int], frozenset[str]]:
        """Each job's size, what it would keep but for room (``keep``: its size, or its current
        size where a rescale gate holds it there, whichever is smaller), and the jobs whose minimum
        fits (the others wait for it). ``running``: the jobs with a trainer running."""
        # Everything but the trainers we are planning counts as load (``cap``); pods still waiting
        # for a node (``pending``) are placed below, by priority.
        tiers = sorted({j.priority for j in snapshot.jobs} | {p.priority for p in pending}, reverse=True)
        alloc = {j.name: 0 for j in snapshot.jobs}
        # Strict priority for what must run: waiting pods and every job's minimum, tier by tier.
        for tier in tiers:
            for p in sorted((p for p in pending if p.priority == tier), key=lambda p: p.name):
                if cap.place_nominated(p) is None:
                    cap.place(p.requests)  # a pod that fits nowhere stays pending either way
            for j in sorted((j for j in snapshot.jobs if j.priority == tier), key=lambda j: j.name):
                self._place_min(cap, j, alloc)
        after_min = cap.copy()
        floor = dict(alloc)
        weight = self.weights(snapshot.jobs)
        self._grow(cap, sorted(snapshot.jobs, key=lambda j: j.name), alloc, weight, self.keep_bonus,
                   self._charges(snapshot.jobs, running))
        startable = frozenset(j.name for j in snapshot.jobs if floor[j.name] >= j.min)
        return (*self._settle(snapshot.jobs, alloc, floor, after_min, weight), startable)

    def _settle(self, jobs: tuple[JobDemand, ...], fair: dict[str, int], floor: dict[str, int],
                cap: Capacity, weight: dict[str, float]) -> tuple[dict[str, int], dict[str, int]]:
        """From fair shares to targets: only rescales that pay for their pause, and only what fits.

        Every change of a job's size pauses it (measured ``rescale_cost_s``). A job grows only
        when the throughput gained over the time it has left beats its pause; it gives trainers
        up voluntarily only when the move is large enough to pay for two pauses (its own and the
        receiver's); shrinking by ``band`` trainers never is. Forced shrinks always go through:
        the sizes are placed on the cluster after every higher-priority pod and every minimum,
        jobs that keep or shrink first (they hold those trainers now), then growers, each by
        priority and weight; whatever no longer fits is handed back in this decision, by the
        jobs the fair shares value least.
        """
        want: dict[str, int] = {}
        for j in jobs:
            f = min(fair[j.name], j.max)
            if f < j.min:
                want[j.name] = j.min  # its minimum does not fit: it waits, as pending pods do
            elif f > j.current:
                want[j.name] = f if self._pays_to_grow(j, f) else max(j.current, j.min)
            elif f < j.current <= j.max and not self._pays_to_shrink(j, f):
                want[j.name] = j.current
            else:
                want[j.name] = f
        held = {j.name: min(want[j.name], j.current) for j in jobs}
        if all(want[j.name] == fair[j.name] for j in jobs):
            return want, held  # the fair plan itself, placed trainer by trainer already
        keepers = sorted((j for j in jobs if want[j.name] <= j.current),
                         key=lambda j: (-j.priority, -weight[j.name], j.name))
        growers = sorted((j for j in jobs if want[j.name] > j.current),
                         key=lambda j: (-j.priority, -weight[j.name], j.name))
        target: dict[str, int] = {}
        for j in (*keepers, *growers):
            have, placed = floor.get(j.name, 0), []
            if have < j.min:
                target[j.name] = j.min  # waits for its minimum
                continue
            while have < want[j.name]:
                node = cap.place(j.trainer, job=j.name)
                if node is None:
                    break
                placed.append(node)
                have += 1
            keep = max(j.current, j.min)  # a job below its minimum (it was shrunk by force) keeps the minimum
            if keep < have < want[j.name] and not self._pays_to_grow(j, have):
                for node in placed[len(placed) - (have - keep):]:  # a partial growth that does not pay
                    cap.release(node, j.trainer)
                have = keep
            target[j.name] = have
        return target, held

    def _charges(self, jobs: tuple[JobDemand, ...], running: set[str]) -> dict[str, float]:
        """What starting a change of size costs each running job, in log throughput: its pause over the
        policy's horizon, ``-log(1 - pause / horizon)`` (infinite when the pause is the horizon or more). A
        job none of whose trainers runs yet changes for free: its first generation forms with them."""
        out: dict[str, float] = {}
        for j in jobs:
            if j.name in running and j.rescale_cost_s > 0:
                frac = j.rescale_cost_s / self.horizon_s
                out[j.name] = math.inf if frac >= 1 else -math.log(1 - frac)
        return out

    def _horizon(self, j: JobDemand) -> float:
        """How long a change of size matters: the policy's horizon, or until the job is done."""
        if j.remaining is not None and j.speed(j.current) > 0:
            return min(self.horizon_s, j.remaining / j.speed(j.current))
        return self.horizon_s

    def _pays_to_grow(self, j: JobDemand, n: int) -> bool:
        if j.rescale_cost_s <= 0 or j.current < 1:
            return True
        gained = (j.speed(n) - j.speed(j.current)) * self._horizon(j)
        return gained > j.speed(j.current) * j.rescale_cost_s

    def _pays_to_shrink(self, j: JobDemand, n: int) -> bool:
        if j.current - n <= self.band:
            return False  # shares one trainer apart flip as the cluster breathes; each flip costs two pauses
        if j.rescale_cost_s <= 0:
            return True
        freed = (j.speed(j.current) - j.speed(n)) * self._horizon(j)
        return freed > 2 * j.speed(j.current) * j.rescale_cost_s

    @staticmethod
    def remaining_key(jobs: tuple[JobDemand, ...]) -> tuple:
        """All this policy reads of the jobs' remaining work: the completion order per priority
        level. Two snapshots that differ only in remaining work but share this key get the same plan:
        the rescale gates also read remaining work (a change matters until the job is done), but
        only ever more strictly as work shrinks, so a change they held back stays held back."""
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
            node = cap.place(j.trainer, job=j.name)
            if node is None:
                break
            placed.append(node)
        if len(placed) < j.min:
            for node in placed:  # all or nothing: a partial minimum helps nobody
                cap.release(node, j.trainer)
        else:
            alloc[j.name] = j.min

    @staticmethod
    def _grow_counted(room: int, jobs: list[JobDemand], alloc: dict[str, int],
                      entry: Callable[[JobDemand, int], tuple[float, int, str, int] | None]) -> bool:
        """``_grow``'s heap, for trainers of one shape that fit ``room`` times: each job's steps listed
        ahead, all sorted once, and handed out in that order until the room is taken. That is the
        order the heap pops them in when every job's steps come in the heap's order (its gains do
        not rise as it grows, as a concave speed-up has it): then the cost is the jobs' steps up to
        their maximum, not a heap round per trainer. ``False``, with nothing changed, when a job's
        steps do not (a measured curve with a bend up): the caller runs the heap."""
        steps: list[tuple[float, int, str, int]] = []
        for j in jobs:
            n, last = alloc[j.name], None
            # Steps beyond the room are never handed out: a job's list stops there.
            while n < alloc[j.name] + room and (e := entry(j, n)) is not None:
                if last is not None and e < last:
                    return False
                steps.append(e)
                last, n = e, n + e[3]
        steps.sort()
        for _, _, name, step in steps:
            if room <= 0:
                break
            got = min(step, room)
            alloc[name] += got
            room -= got
        return True

    @staticmethod
    def _grow(cap: Capacity, jobs: list[JobDemand], alloc: dict[str, int], weight: dict[str, float],
              keep_bonus: float = 1.0, charge: dict[str, float] | None = None) -> None:
        """Spare capacity, trainer by trainer, to the largest weighted gain in log throughput.

        ``charge``: what starting a change costs a job (``_charges``). A job at its current size grows
        only by a step whose gain, net of that charge, is the best per trainer (``(log T(m) - log T(n)
        - charge) / (m - n)`` over ``m``), and takes the whole step when its turn comes; once it grows,
        each further trainer is valued alone (the pause is paid). So the capacity that frees goes to
        few jobs in large steps, not one trainer to each job (a pause each)."""
        heap: list[tuple[float, int, str, int]] = []
        by_name = {j.name: j for j in jobs}
        charge = charge or {}

        # The bonus only holds between jobs of one priority: a higher-priority job gets its share.
        top = max((j.priority for j in jobs), default=0)

        def entry(j: JobDemand, n: int) -> tuple[float, int, str, int] | None:
            """What the job's next step weighs at ``n`` trainers, as the heap orders it (smallest first):
            ``(-value, 0 if held, name, step)``; ``None`` when it grows no further."""
            if not (j.min <= n < j.max and n > 0):
                return None
            # Larger weighted gain first; a trainer the job holds now weighs ``keep_bonus`` more,
            # and on a tie the job that holds it keeps it.
            held = j.current > n and j.priority == top
            step, value = 1, weight[j.name] * log_gain(j, n) * (keep_bonus if held else 1.0)
            kappa = charge.get(j.name, 0.0) if n == j.current else 0.0
            if kappa > 0 and j.speed(n) > 0:
                if kappa == math.inf:
                    return None
                base, best = math.log(j.speed(n)), -math.inf
                for m in range(n + 1, j.max + 1):
                    s = j.speed(m)
                    rate = (math.log(s) - base - kappa) / (m - n) if s > 0 else -math.inf
                    if rate > best:
                        best, step = rate, m - n
                if best <= 0:
                    return None  # no step pays for the pause
                value = weight[j.name] * best
            return (-value, 0 if held else 1, j.name, step)

        def push(j: JobDemand) -> None:
            e = entry(j, alloc[j.name])
            if e is not None:
                heapq.heappush(heap, e)

        # Where every job's trainer has one shape and may go anywhere, which job a trainer is for does
        # not change where best fit puts it: the trainers that fit are a count (``count_fits``), handed
        # out in the order the jobs win them (``_grow_counted``); where that order needs the heap, they
        # are placed ahead in batches that double (``place_many`` fills node by node, as repeated best
        # fit places them) rather than by a heap look-up per trainer. The caller reads only the sizes
        # from this capacity, not its nodes.
        shapes = {j.trainer for j in jobs}
        one_shape = len(shapes) == 1 and next(iter(shapes)).cpu > 0 and not any(j.name in cap.eligible for j in jobs)
        if one_shape and EdlPolicy._grow_counted(cap.count_fits(next(iter(shapes))), jobs, alloc, entry):
            return
        pool, batch, full = 0, 1, False  # placed ahead, not yet handed out; the next batch; nothing more fits

        def take(j: JobDemand, step: int) -> int:
            nonlocal pool, batch, full
            if one_shape:
                while pool < step and not full:
                    ask = max(batch, step - pool)
                    got = len(cap.place_many(j.trainer, ask))
                    pool, batch, full = pool + got, 2 * batch, got < ask
                got = min(step, pool)
                pool -= got
                return got
            got = 0
            while got < step and cap.place(j.trainer, job=j.name) is not None:
                got += 1
            return got

        for j in jobs:
            push(j)
        while heap:
            _, _, name, step = heapq.heappop(heap)
            j = by_name[name]
            got = take(j, step)
            if got == 0:
                continue  # no node holds another trainer of this shape
            alloc[name] += got
            push(j)
