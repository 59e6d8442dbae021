"""A Kubernetes cluster in virtual time, driven by the same policy code as the sidecar.

Time advances in ticks (1 s by default). Each tick, in order: controllers make
pods match their owners' wishes (service replica schedules, each job's fixed
pods and trainer target), the autoscaler decides every ``period_s`` from a
snapshot exactly as the sidecar would (its plan's placement becomes each new
trainer's preferred node, as the launcher makes it on Kubernetes), the scheduler
binds pending pods (priority first; kube-scheduler's default profile,
``edl.sim.kube_scheduler``, so a preferred node is followed only where the real
scheduler would; priority preemption of strictly lower-priority pods), bound pods start after their
start-up latency, and jobs make progress at their modelled throughput, pausing
for ``rescale_cost_s`` whenever their running trainer count changes (a job's start
is not a change: as edl's master does, its first generation forms once every trainer
asked for runs, or after a 20 s grace with what runs).

Ground truth (true throughput, start-up jitter) stays in here; the policy sees
only the snapshot and each job's demand. Invariants are checked every tick.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any
from dataclasses import dataclass, field

import numpy as np

from edl.api.cluster import JobDemand, Node, Pod, PodPhase, PodTotals, Resources, Snapshot, units
from edl.api.ledger import PodLedger
from edl.api.master import START_GRACE_S
from edl.api.policy import free_hints, leaving
from edl.autoscale.policy import get_policy
from edl.sim.kube_scheduler import Scheduler
from edl.sim.scenario import ScenarioJob, Scenario

EPS = 1e-9


@dataclass
class SimPod:
    id: int
    owner: str
    kind: str  # "service" or "job"
    role: str  # "trainer", a fixed role, or "replica"
    req: np.ndarray
    priority: int
    created: float
    startup: float
    grace_s: float = 0.0  # how long it holds its node after deletion
    node: int | None = None
    bound_at: float | None = None
    running: bool = False
    terminating_until: float | None = None
    view: Pod | None = None  # cached snapshot view and the state it was built from
    view_key: tuple | None = None
    name: str | None = None  # set for pods created by name (a launcher's trainers and master)
    hint: int | None = None  # the node of its preferred node affinity (a trainer the plan placed)


@dataclass(frozen=True)
class PlacedInstant:
    """One instant of a run, for a bound that keeps some pods where this run's scheduler put them
    (``edl.sim.bound.placed_bound``).

    ``kept_cpu``: CPU requested by the pods kept where they are; ``free``: per distinct free capacity
    those pods leave on a node, how many nodes have it; ``movable``: the pods packed anew, per shape
    how many (pods still waiting for a node among them, and every elastic job's trainers up to what
    the policy may give it: ``max``, or ``static`` under ``off``)."""
    t: float
    kept_cpu: float
    free: tuple[tuple[Resources, int], ...]
    movable: tuple[tuple[Resources, int], ...]


@dataclass
class JobState:
    spec: ScenarioJob
    submitted: bool = False
    target: int = 0
    done: float = 0.0
    completed_at: float | None = None
    paused_until: float = 0.0
    last_running: int = 0
    trainer_samples: list[int] = field(default_factory=list)
    cancelled: bool = False  # its launcher removed it
    started_at: float | None = None  # its first trainer runs: it is pending until then
    formed_at: float | None = None  # its first generation formed
    curve: tuple[float, ...] = ()  # throughput with n trainers, n = 0..max (computed once)
    roles: tuple[str, ...] = ()  # its pods' roles other than trainer: fixed pods, and a launcher's master
    hints: tuple[str, ...] = ()  # the plan's nodes for its trainers (``Plan.nodes``)

    def __post_init__(self) -> None:
        self.curve = tuple(self.spec.throughput(n) for n in range(max(self.spec.max, self.spec.static) + 1))
        self.roles = (*dict.fromkeys(f.role for f in self.spec.fixed_pods if f.role != "trainer"), "master")


class Simulation:
    def __init__(self, scenario: Scenario, policy: str, seed: int = 0, check_invariants: bool = True,
                 external: frozenset[str] = frozenset(), reuse_plans: bool = True,
                 record_placement: bool = False) -> None:
        self.sc = scenario
        # Jobs whose trainers a real launcher and sidecar manage through ``edl.sim.backend``:
        # the built-in controllers and autoscaler leave them alone.
        self.external = external
        self.policy_name = policy
        self.policy = None if policy == "off" else get_policy(policy)
        self.rng_startup = random.Random(seed * 7919 + 1)  # one generator per stream
        self.rng_sched = random.Random(seed * 7919 + 2)
        self.check = check_invariants
        allocs = []
        for g in scenario.nodes:
            allocs += [[g.allocatable.cpu, g.allocatable.memory, g.allocatable.gpu]] * g.count
        self.alloc = np.array(allocs, dtype=float)
        self.used = np.zeros_like(self.alloc)
        self.total_cpu = float(self.alloc[:, 0].sum())
        self.node_names = [f"node-{i:05d}" for i in range(len(self.alloc))]
        self.node_index = {n: i for i, n in enumerate(self.node_names)}
        self.scheduler = Scheduler(scenario.nodes_to_score_percent, pack=scenario.scoring == "pack")
        self.pods: dict[int, SimPod] = {}
        self.by_owner: dict[str, dict[int, SimPod]] = {}  # owner -> its pods, for O(own pods) lookups
        self.next_id = 0
        self.jobs = {j.name: JobState(j) for j in scenario.jobs}
        self.service_lags: dict[str, list[float]] = {s.name: [] for s in scenario.services}
        self._open_increase: dict[str, tuple[float, int] | None] = {s.name: None for s in scenario.services}
        self._last_target: dict[str, int] = {s.name: 0 for s in scenario.services}
        self.rescale_events = 0
        self.timeline: list[dict] = []
        self._nodes_view: tuple[Node, ...] | None = None
        self.running_cpu = 0.0  # CPU requests of running pods, kept as pods start and go
        self.now = 0.0  # virtual time of the current tick
        # Anything the policy sees changed since its last decision (pods, jobs, targets)? If not,
        # and the jobs' completion order is the same, the pure policy would plan the same: skip.
        self.changed = True
        self._last_key: tuple | None = None
        self.reuse_plans = reuse_plans
        self.decisions = 0
        # Incremental bookkeeping, so that a tick costs what changes, not what exists:
        self.pending: dict[int, SimPod] = {}  # waiting for a node
        self.starting: dict[int, SimPod] = {}  # bound, not running yet
        self.terminating: dict[int, SimPod] = {}  # in their grace period
        self.active: dict[tuple[str, str], int] = {}  # (owner, role) -> pods not terminating
        self.running_active: dict[tuple[str, str], int] = {}  # ... of which running
        self.events: list[tuple[float, str, str, str]] = []  # (time, job, reason, message) from launchers
        # Per tick, with ``record_placement``: (only the trainers movable, every job pod movable), the
        # services (and fixed pods) kept where they ran; for the bounds of what placement could reach.
        self.placed: list[tuple[PlacedInstant, PlacedInstant]] | None = [] if record_placement else None
        self.placement_version = 0  # counts changes to which pods exist, where they are bound, which jobs run
        # The pods summed as the sidecar's informer keeps them (``Snapshot.totals``), by pod id: the pods
        # changed since the last snapshot are handed to it then.
        self.ledger = PodLedger()
        self._changed_pods: set[int] = set()
        self._views: dict[int, Pod] = {}  # every pod's view, in the order the pods were created
        self._placed_version = -1

    # ------------------------------------------------------------------ pods
    def _create(self, owner: str, kind: str, role: str, req: Resources, priority: int, t: float, startup: float,
                grace_s: float) -> SimPod:
        jitter = startup * self.rng_startup.uniform(0.8, 1.2)
        pod = SimPod(self.next_id, owner, kind, role, np.array([req.cpu, req.memory, req.gpu]), priority, t, jitter,
                     grace_s)
        self.pods[pod.id] = pod
        self._touch(pod)
        self.by_owner.setdefault(owner, {})[pod.id] = pod
        self.next_id += 1
        self.changed = True
        self.placement_version += 1
        self.pending[pod.id] = pod
        key = (owner, role)
        self.active[key] = self.active.get(key, 0) + 1
        return pod

    def _touch(self, pod: SimPod) -> None:
        """The pod's view changes (created, bound, started, terminating, gone)."""
        self._changed_pods.add(pod.id)

    def _deactivate(self, pod: SimPod) -> None:
        """The pod stops counting for its owner (it terminates or is gone)."""
        key = (pod.owner, pod.role)
        self.active[key] -= 1
        if pod.running:
            self.running_active[key] -= 1

    def _delete(self, pod: SimPod, t: float | None = None) -> None:
        """Delete now (``t`` None), or start the pod's grace period: it holds its node until then."""
        self.changed = True
        self.placement_version += 1
        self._touch(pod)
        if t is not None and pod.node is not None and pod.grace_s > 0:
            if pod.terminating_until is None:
                pod.terminating_until = t + pod.grace_s
                self._deactivate(pod)
                self.starting.pop(pod.id, None)
                self.terminating[pod.id] = pod
            return
        if pod.terminating_until is None:
            self._deactivate(pod)
        if pod.node is not None:
            self.used[pod.node] -= pod.req
        if pod.running:
            self.running_cpu -= pod.req[0]
        del self.pods[pod.id]
        del self.by_owner[pod.owner][pod.id]
        self.pending.pop(pod.id, None)
        self.starting.pop(pod.id, None)
        self.terminating.pop(pod.id, None)

    def _owned(self, owner: str, role: str | None = None) -> list[SimPod]:
        return [p for p in self.by_owner.get(owner, {}).values() if p.terminating_until is None
                and (role is None or p.role == role)]

    def _reconcile(self, owner: str, kind: str, role: str, want: int, req: Resources, prio: int, t: float,
                   startup: float, grace_s: float = 0.0, hints: tuple[str, ...] = ()) -> None:
        if self.active.get((owner, role), 0) == want:
            return  # the common case, without looking at the pods
        have = self._owned(owner, role)
        # New pods prefer the planned nodes no pod of theirs has yet (bound there, or preferring it).
        free = free_hints(hints, (self.node_names[p.node] if p.node is not None else
                                  None if p.hint is None else self.node_names[p.hint] for p in have)) if hints else []
        for k in range(want - len(have)):
            pod = self._create(owner, kind, role, req, prio, t, startup, grace_s)
            if k < len(free):
                pod.hint = self.node_index[free[k]]
        if len(have) > want:
            # Remove unscheduled pods first, then the youngest (as a ReplicaSet does); a job's trainers
            # as edl's launcher drains them: those on nodes the plan does not keep first (``leaving``).
            have.sort(key=lambda p: (p.node is not None, p.running, -p.created, -p.id))
            going = {p.id: p for p in have}
            order = [(str(p.id), None if p.node is None else self.node_names[p.node]) for p in have]
            for pid in leaving(len(have) - want, hints, order):
                self._delete(going[int(pid)], t)

    # ------------------------------------------------------------ controllers
    def _controllers(self, t: float) -> None:
        for s in self.sc.services:
            target = s.target(t)
            if target > self._last_target[s.name]:
                self._open_increase[s.name] = (t, target)
            self._last_target[s.name] = target
            self._reconcile(s.name, "service", "replica", target, s.pod, s.priority, t, s.startup_s, s.termination_s)
        for js in self.jobs.values():
            j = js.spec
            if js.completed_at is not None or js.cancelled or t < j.submit_at:
                continue
            created = not js.submitted
            if created:
                js.submitted = True
                self.changed = True
                self.placement_version += 1
                js.target = j.static if self.policy is None else j.min
            for f in j.fixed_pods:
                self._reconcile(j.name, "job", f.role, f.count, f.pod, j.priority, t, j.startup_s)
            if created and j.fixed_pods:
                self._place_fixed(j.name, t)
            if j.name in self.external:
                continue  # its launcher creates and deletes the trainers
            # edl's launcher drains a trainer at a step boundary before deleting it; a plain
            # Job controller (off, edl2017) deletes and waits out the grace period.
            grace = j.drain_s if self.policy_name == "edl" else j.termination_s
            self._reconcile(j.name, "job", "trainer", js.target, j.trainer, j.priority, t, j.startup_s, grace,
                            js.hints)

    def _place_fixed(self, job: str, t: float) -> None:
        """A job's fixed pods, just created, prefer the nodes the policy's plan gives them: as edl's
        launcher asks the plan where the pods it creates go (``Plan.pods``) before it creates them."""
        if self.policy is None:
            return  # off: nothing plans
        plan = self.policy.plan(self.snapshot(t))
        if not plan.pods:
            return  # a policy that places nothing (edl2017)
        for p in self._owned(job):
            if p.role != "trainer" and p.node is None:
                node = plan.pods.get(self._view(p).name)
                if node is not None:
                    p.hint = self.node_index[node]

    # ------------------------------------------------------------- autoscaler
    def _demands(self) -> tuple[JobDemand, ...]:
        return tuple(
            JobDemand(js.spec.name, js.spec.min, js.spec.max, js.target, js.spec.trainer, js.spec.priority,
                      js.curve, js.spec.rescale_cost_s,
                      None if js.spec.work is None else max(0.0, js.spec.work - js.done))
            for js in self.jobs.values() if js.submitted and js.completed_at is None and not js.cancelled)

    def nodes_view(self) -> tuple[Node, ...]:
        if self._nodes_view is None:
            self._nodes_view = tuple(Node(n, Resources(*a)) for n, a in zip(self.node_names, self.alloc))
        return self._nodes_view

    def pods_view(self) -> tuple[Pod, ...]:
        return self.pods_and_totals()[0]

    def pods_and_totals(self) -> tuple[tuple[Pod, ...], PodTotals]:
        """Every pod as the sidecar's informer would hold it, and their sums (``Snapshot.totals``): the
        views of the pods changed since the last call are made again, the others kept."""
        for pid in sorted(self._changed_pods):  # new pods (higher ids) after the others, as created
            p = self.pods.get(pid)
            if p is None:
                self._views.pop(pid, None)
                self.ledger.put(str(pid), None)
            else:
                self._views[pid] = v = self._view(p)
                self.ledger.put(str(pid), v)
        self._changed_pods.clear()
        return tuple(self._views.values()), self.ledger.totals()

    def snapshot(self, t: float, jobs: tuple[JobDemand, ...] | None = None) -> Snapshot:
        pods, totals = self.pods_and_totals()
        return Snapshot(self.nodes_view(), pods, self._demands() if jobs is None else jobs, t, totals)

    def _view(self, p: SimPod) -> Pod:
        """What the sidecar's informer would hold for this pod (rebuilt only when it changes)."""
        key = (p.running, p.terminating_until is not None, p.node)
        if p.view is None or p.view_key != key:
            terminating = p.terminating_until is not None
            p.view = Pod(p.name or f"p{p.id}", Resources(*p.req),
                         PodPhase.RUNNING if (p.running or terminating) else PodPhase.PENDING, p.priority,
                         None if p.node is None else self.node_names[p.node],
                         p.owner if p.kind == "job" and not terminating else None,
                         "other" if terminating else
                         ("trainer" if p.role == "trainer" else ("fixed" if p.kind == "job" else "other")))
            p.view_key = key
        return p.view

    def _autoscale(self, t: float) -> None:
        if self.policy is None:
            return
        jobs = self._demands()
        if not jobs:
            return
        key = self.policy.remaining_key(jobs)
        if self.reuse_plans and not self.changed and key == self._last_key:
            return  # the same input up to remaining work, the same completion order: the same plan
        snap = self.snapshot(t, jobs)
        plan = self.policy.plan(snap)
        self.decisions += 1
        self.changed, self._last_key = False, key
        for name, n in plan.sizes.items():
            if name in self.external:
                continue  # sized by its own sidecar
            js = self.jobs[name]
            js.hints = plan.nodes.get(name, ())
            if not js.spec.min <= n <= js.spec.max:
                raise AssertionError(f"policy planned {n} trainers for {name} outside {js.spec.min}..{js.spec.max}")
            if js.target != n:
                js.target = n
                self.changed = True

    # -------------------------------------------------------------- scheduler
    def _schedule(self, t: float) -> None:
        pending = sorted(self.pending.values(), key=lambda p: (-p.priority, p.created, p.id))
        for p in pending:
            if p.id not in self.pods:
                continue  # preempted while we went
            node = self.scheduler.pick(self.alloc, self.used, p.req, p.hint, self.rng_sched.randrange)
            if node is None:
                node = self._preempt(p) if self.sc.preemption else None
                if node is None:
                    continue
            p.node, p.bound_at = node, t
            self._touch(p)
            self.used[node] += p.req
            self.changed = True
            self.placement_version += 1
            del self.pending[p.id]
            self.starting[p.id] = p

    def _preempt(self, p: SimPod) -> int | None:
        """Evict strictly lower-priority pods from the node where the fewest must go."""
        best: tuple[int, int, list[SimPod]] | None = None
        by_node: dict[int, list[SimPod]] = {}
        for q in self.pods.values():
            if q.node is not None and q.priority < p.priority and q.terminating_until is None:
                by_node.setdefault(q.node, []).append(q)
        for node, victims in by_node.items():
            free = self.alloc[node] - self.used[node]
            chosen = []
            for q in sorted(victims, key=lambda q: (q.priority, -q.created)):
                if np.all(free + EPS >= p.req):
                    break
                chosen.append(q)
                free = free + q.req
            if np.all(free + EPS >= p.req) and (best is None or len(chosen) < best[0]):
                best = (len(chosen), node, chosen)
        if best is None:
            return None
        for q in best[2]:
            self._delete(q)  # preemption: the victim's node space is taken at once (simplification)
        return best[1]

    # ------------------------------------------------------------- the clock
    def _start_and_progress(self, t: float, dt: float) -> None:
        for p in sorted([*self.terminating.values(), *self.starting.values()], key=lambda p: p.id):
            if p.terminating_until is not None:
                if t >= p.terminating_until:
                    self._delete(p)
                continue
            assert p.bound_at is not None  # a starting pod is bound
            if t >= p.bound_at + p.startup:
                p.running = True
                self._touch(p)
                self.running_cpu += p.req[0]
                self.changed = True
                del self.starting[p.id]
                key = (p.owner, p.role)
                self.running_active[key] = self.running_active.get(key, 0) + 1
        for js in self.jobs.values():
            if not js.submitted or js.completed_at is not None:
                continue
            name = js.spec.name
            roles = [(name, "trainer"), *((name, r) for r in js.roles)]
            running = self.running_active.get((name, "trainer"), 0)
            fixed_ok = all(self.running_active.get(k, 0) == self.active.get(k, 0) for k in roles[1:])
            js.trainer_samples.append(running)
            if js.formed_at is None:
                # As edl's master does: the first generation forms once every trainer asked for
                # runs (or after its start grace, with what runs): starting is not a rescale.
                if running == 0:
                    continue
                if js.started_at is None:
                    js.started_at = t
                if running < self.active.get((name, "trainer"), 0) and t - js.started_at < START_GRACE_S:
                    continue
                js.formed_at, js.last_running = t, running
            if running != js.last_running:
                if js.last_running > 0 and running > 0:
                    self.rescale_events += 1
                    js.paused_until = t + js.spec.rescale_cost_s
                js.last_running = running
            if js.spec.work is not None and fixed_ok and running > 0 and t >= js.paused_until:
                js.done += js.curve[min(running, len(js.curve) - 1)] * dt
                if js.done >= js.spec.work:
                    js.completed_at = t + dt
                    for p in list(self.by_owner.get(js.spec.name, {}).values()):
                        self._delete(p)  # the job is done: its pods go at once

    def _observe(self, t: float) -> None:
        running_cpu = self.running_cpu
        svc = {}
        for s in self.sc.services:
            n = self.running_active.get((s.name, "replica"), 0)
            svc[s.name] = (n, s.target(t))
            inc = self._open_increase[s.name]
            if inc is not None and n >= min(inc[1], s.target(t)):
                self.service_lags[s.name].append(t - inc[0])
                self._open_increase[s.name] = None
        active = {name: js.last_running for name, js in self.jobs.items()
                  if js.submitted and js.completed_at is None and js.last_running > 0}
        pending_jobs = sum(1 for js in self.jobs.values() if js.submitted and js.started_at is None)
        self.timeline.append({"t": t, "util": running_cpu / self.total_cpu, "trainers": active,
                              "pending_jobs": pending_jobs, "services": svc})
        if self.placed is not None:
            if self.placement_version != self._placed_version or not self.placed:
                self.placed.append(self._placed_instants(t))
                self._placed_version = self.placement_version
            else:  # nothing placed or removed since: the same instants, later
                trainers, jobs = self.placed[-1]
                self.placed.append((dataclasses.replace(trainers, t=t), dataclasses.replace(jobs, t=t)))
        if self.check:
            if np.any(self.used > self.alloc + 1e-6):
                raise AssertionError(f"t={t}: a node is over-committed")
            if t % 600 < self.sc.period_s:  # every ten minutes: the sums the policy reads are the pods'
                snap = self.snapshot(t, ())
                load: dict[str, list[int]] = {}
                for v in snap.pods:
                    if v.role != "trainer" and v.node is not None:
                        u = units(v.requests)
                        load[v.node] = [a + b for a, b in zip(load.get(v.node, [0, 0, 0]), u)]
                if snap.totals is None or {k: tuple(x) for k, x in load.items() if any(x)} != snap.totals.load:
                    raise AssertionError(f"t={t}: the pod ledger's load is not its pods'")

    def _placed_instants(self, t: float) -> tuple[PlacedInstant, PlacedInstant]:
        """Now, for two bounds: (1) every pod but the trainers kept where it is bound, which is all a
        policy that places only its trainers can use; (2) only the services' pods kept, the jobs' fixed
        pods packed with the trainers. Pods waiting for a node are packed in both; a terminating pod
        holds its node as it does here (a trainer too: it is gone only at the end of its drain or grace).
        Each elastic job may have up to ``max`` trainers besides."""
        def resources(r: np.ndarray) -> Resources:
            return Resources(*(round(float(x), 6) for x in r))

        waiting: dict[Resources, int] = {}
        fixed: dict[Resources, int] = {}
        bound: dict[bool, tuple[list[int], list[np.ndarray]]] = {True: ([], []), False: ([], [])}  # fixed pod?
        for p in self.pods.values():
            is_fixed = p.kind == "job" and p.terminating_until is None
            if is_fixed and p.role == "trainer":
                continue  # counted below, up to what the policy may give each job
            if p.node is None:
                shape = resources(p.req)
                waiting[shape] = waiting.get(shape, 0) + 1
                continue
            nodes, reqs = bound[is_fixed]
            nodes.append(p.node)
            reqs.append(p.req)
            if is_fixed:
                shape = resources(p.req)
                fixed[shape] = fixed.get(shape, 0) + 1

        def kept(job_pods: bool) -> tuple[np.ndarray, float]:
            nodes, reqs = bound[job_pods]
            used = np.zeros_like(self.alloc)
            if nodes:
                np.add.at(used, np.array(nodes), np.array(reqs))
            return used, float(used[:, 0].sum())

        (kept_services, service_cpu), (kept_fixed, fixed_cpu) = kept(False), kept(True)
        trainers: dict[Resources, int] = {}
        for js in self.jobs.values():
            if js.submitted and js.completed_at is None and not js.cancelled:
                shape = js.spec.trainer
                trainers[shape] = trainers.get(shape, 0) + (js.spec.static if self.policy is None else js.spec.max)

        def instant(kept: np.ndarray, kept_cpu: float, movable: dict[Resources, int]) -> PlacedInstant:
            rows, counts = np.unique(np.round(self.alloc - kept, 6), axis=0, return_counts=True)
            free = {Resources(*(float(x) for x in row)): int(n) for row, n in zip(rows, counts)}
            def order(kv: tuple[Resources, int]) -> tuple[float, float, float]:
                return kv[0].cpu, kv[0].memory, kv[0].gpu

            return PlacedInstant(t, kept_cpu, tuple(sorted(free.items(), key=order)),
                                 tuple(sorted(((s, n) for s, n in movable.items() if n > 0), key=order)))

        def merged(*parts: dict[Resources, int]) -> dict[Resources, int]:
            out: dict[Resources, int] = {}
            for part in parts:
                for s, n in part.items():
                    out[s] = out.get(s, 0) + n
            return out

        return (instant(kept_services + kept_fixed, service_cpu + fixed_cpu, merged(trainers, waiting)),
                instant(kept_services, service_cpu, merged(trainers, waiting, fixed)))

    def run(self) -> dict:
        start = time.perf_counter()
        dt = self.sc.tick_s
        steps = int(round(self.sc.duration_s / dt))
        period_ticks = max(1, int(round(self.sc.period_s / dt)))
        for k in range(steps):
            self.tick(k, period_ticks)
        return self.report(time.perf_counter() - start)

    def tick(self, k: int, period_ticks: int) -> None:
        """Tick ``k``: controllers, the autoscaler every ``period_ticks``, scheduler, start-up, progress."""
        dt = self.sc.tick_s
        t = k * dt
        self.now = t
        self._controllers(t)
        if k % period_ticks == 0:
            self._autoscale(t)
            self._controllers(t)
        self._schedule(t)
        self._start_and_progress(t, dt)
        self._observe(t)

    def remove_node(self, node: int, t: float) -> list[SimPod]:
        """A node is lost: its pods are gone and nothing can be placed on it again."""
        lost = [p for p in self.pods.values() if p.node == node]
        for p in lost:
            self._delete(p)
        self.alloc[node] = 0.0
        self.used[node] = 0.0
        self._nodes_view = None
        self.changed = True
        self.placement_version += 1
        return lost

    # ---------------------------------------------------------------- report
    def report(self, wall_s: float) -> dict:
        utils = np.array([x["util"] for x in self.timeline])
        off = self.sc.offpeak
        off_vals = [x["util"] for x in self.timeline if off and off[0] <= x["t"] <= off[1]]
        jains = []
        for x in self.timeline:
            v = np.array(list(x["trainers"].values()), dtype=float)
            if len(v) >= 2:
                jains.append(float(v.sum() ** 2 / (len(v) * (v ** 2).sum())))
        jobs: list[dict[str, Any]] = []
        for js in self.jobs.values():
            if not js.submitted:
                continue
            # Pending until it trains: its fixed pods running beside no trainer are not a start.
            pend = None if js.started_at is None else js.started_at - js.spec.submit_at
            jct = None if js.completed_at is None else js.completed_at - js.spec.submit_at
            running = [n for n in js.trainer_samples if n > 0]
            jobs.append({"name": js.spec.name, "pending_s": pend, "jct_s": jct,
                         "trainers_mean": float(np.mean(running)) if running else 0.0})
        pend_vals = [j["pending_s"] if j["pending_s"] is not None else self.sc.duration_s - js_submit
                     for j, js_submit in ((j, self.jobs[j["name"]].spec.submit_at) for j in jobs)]
        jct_vals = [j["jct_s"] for j in jobs]
        services = []
        for s in self.sc.services:
            lags = list(self.service_lags[s.name])
            inc = self._open_increase[s.name]
            if inc is not None:
                lags.append(self.sc.duration_s - inc[0])  # never caught up
            services.append({"name": s.name, "lag_s_max": max(lags) if lags else 0.0,
                             "lag_s_mean": float(np.mean(lags)) if lags else 0.0})
        return {
            "scenario": self.sc.name,
            "policy": self.policy_name,
            "utilization": {"mean": float(utils.mean()) if len(utils) else 0.0,
                            "offpeak_mean": float(np.mean(off_vals)) if off_vals else None,
                            "p5": float(np.percentile(utils, 5)) if len(utils) else 0.0},
            "pending_s_mean": float(np.mean(pend_vals)) if pend_vals else 0.0,
            "jct_s_mean": None if not jct_vals or any(v is None for v in jct_vals) else float(np.mean(jct_vals)),
            "fairness_jain": float(np.mean(jains)) if jains else 1.0,
            "services": services,
            "jobs": jobs,
            "rescale_events": self.rescale_events,
            "wall_s": wall_s,
        }
