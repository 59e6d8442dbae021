"""The autoscale sidecar: publish this job's demand, read the peers', run the policy, set the size.

Every elastic job runs one sidecar next to its master. There is no central
controller: where sidecars share a view of a cluster (a Kubernetes namespace),
one of them decides for all (``ClusterView.lead``): it runs the policy over the
cluster and every published demand and publishes each job's line of the plan;
each sidecar applies only its own job's line. A random but fixed per-job offset
(jitter) keeps sidecars from acting in the same instant.

The decision step is a plain method over injected parts (cluster view, master
link, clock), so it runs unchanged on Kubernetes (informers and Leases), on the
local backend and in tests.
"""

from __future__ import annotations

import hashlib
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from edl.api.cluster import (ClusterView, JobDemand, PlanLine, Pod, Resources, SizeCause, SizeReason, Snapshot,
                             trainer_priorities, with_priorities)
from edl.api.master import JobStatus, JobView, Reason, SizeLink
from edl.api.policy import Policy

log = logging.getLogger("edl.sidecar")
UNSCHEDULABLE_BACKOFF_PERIODS = 6


# ------------------------------------------------------ measured figures
@dataclass
class ThroughputMeter:
    """Samples per second at each world size, from the master's progress counters (EWMA).

    An interval counts only when one generation trained through it and it is not that generation's
    first: the first holds the change's pause and the joiners' warm-up, and would make the size look
    slower than it trains (once the job leaves that size, nothing would correct it)."""

    alpha: float = 0.3
    by_world: dict[int, float] = field(default_factory=dict)
    _last: tuple[float, int, int, int] | None = None  # (time, rows done, world size, generation)
    _warmed: int | None = None  # the generation whose first interval has passed

    def observe(self, now: float, rows_done: int, world: int, generation: int = 0) -> None:
        last = self._last
        self._last = (now, rows_done, world, generation)
        if (last is None or world <= 0 or last[2] != world or last[3] != generation or now <= last[0]
                or rows_done < last[1]):
            return  # the first sample, or the generation changed in between: no clean figure
        if self._warmed != generation:
            self._warmed = generation  # its first whole interval: the switch's pause and warm-up
            return
        rate = (rows_done - last[1]) / (now - last[0])
        if rate <= 0:
            return
        old = self.by_world.get(world)
        self.by_world[world] = rate if old is None else (1 - self.alpha) * old + self.alpha * rate

    def forget_above(self, world: int) -> None:
        """Drop the figures of sizes above ``world``: the job left them, and a figure it can no longer
        correct (measured on a busier cluster, or in a preemption's last seconds) must not keep it from
        growing back; an unmeasured size is judged by the policy's prior until it is measured again."""
        self.by_world = {n: v for n, v in self.by_world.items() if n <= world}

    def curve(self) -> tuple[float, ...]:
        """Index n: samples/s with n trainers, measured or interpolated; () until something is measured."""
        if not self.by_world:
            return ()
        known = sorted(self.by_world.items())
        top = known[-1][0]
        out = [0.0]
        for n in range(1, top + 1):
            below = [(k, v) for k, v in known if k <= n]
            above = [(k, v) for k, v in known if k >= n]
            if below and above:
                (k0, v0), (k1, v1) = below[-1], above[0]
                out.append(v0 if k1 == k0 else v0 + (v1 - v0) * (n - k0) / (k1 - k0))
            else:
                k1, v1 = above[0]
                out.append(v1 * n / k1)  # below the smallest measured size: linear
        return tuple(out)


def rescale_cost_s(status: JobView) -> float:
    """Median measured pause of this job's generation changes (0 until one was measured)."""
    pauses = [g.pause_s for g in status.generations
              if g.pause_s is not None and g.reason not in (Reason.START, Reason.RESUME)]
    return float(statistics.median(pauses)) if pauses else 0.0


# ----------------------------------------------------------- the parts
@dataclass(frozen=True)
class SidecarConfig:
    job: str  # the qualified job name the policy sees (namespace/job on Kubernetes)
    trainer: Resources
    min: int
    max: int
    period_s: float = 10.0
    jitter_s: float = 2.0
    node_selector: tuple[tuple[str, str], ...] = ()  # where the trainers may go (``JobDemand``)
    tolerations: tuple[tuple[str, str, str], ...] = ()


def job_offset(job: str, jitter_s: float) -> float:
    """A fixed offset in [0, jitter) from the job's name: sidecars spread out deterministically."""
    h = int.from_bytes(hashlib.sha256(job.encode()).digest()[:8], "big")
    return (h / 2 ** 64) * jitter_s


class Sidecar:
    def __init__(self, cfg: SidecarConfig, view: ClusterView, master: SizeLink, policy: Policy,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.view = view
        self.master = master
        self.policy = policy
        self.clock = clock
        self.meter = ThroughputMeter()
        self.holding = False
        self.master_away = False
        self.decisions = 0
        self.priority: int | None = None
        self.reason: SizeReason | None = None  # why the job is at its size, as last decided
        self._priorities: dict[str, int] = {}  # each job's trainers' priority, as last seen (deciding sidecar)
        self._held_since: dict[str, float] = {}  # trainers held for a decision: when this sidecar first saw them
        self._blocked_report: float | None = None  # the master's last unschedulable report, as it gave it
        self._blocked_since: float | None = None  # when this sidecar first saw it (its own clock)

    def _priority(self, pods: list[Pod]) -> int:
        """The priority the scheduler resolved for this job's trainers (fixed for the job's life:
        found once, then kept, so that a large cluster is not scanned every period)."""
        if self.priority is None:
            found = [p.priority for p in pods if p.job == self.cfg.job and p.role == "trainer"]
            if not found:
                return 0
            self.priority = max(found)
        return self.priority

    def demand(self, status: JobView, pods: list[Pod]) -> JobDemand:
        priority = self._priority(pods)
        rows_left = None
        if status.rows_per_epoch and status.epochs:
            rows_left = max(0.0, float(status.rows_per_epoch * status.epochs - sum(status.done_rows)))
        return JobDemand(name=self.cfg.job, min=self.cfg.min, max=self.cfg.max,
                         current=status.desired_trainers, trainer=self.cfg.trainer, priority=priority,
                         throughput=self.meter.curve(), rescale_cost_s=rescale_cost_s(status), remaining=rows_left,
                         node_selector=self.cfg.node_selector, tolerations=self.cfg.tolerations)

    def step(self) -> int | None:
        """One decision. Returns the new size if it changed it, else ``None``."""
        self.view.refresh(self.clock())
        now = self.clock()  # after the read, which may have waited on the API: a Lease renewed at this time
        # Every period while the view is current, whatever follows: the deciding sidecar keeps its Lease renewed.
        leading = self.view.healthy() and self.view.lead(now)
        status = self.master.status()
        if status is None:
            if not self.master_away:
                log.warning("master unreachable (restarting?); holding")
            self.master_away = True
            return None
        self.master_away = False
        if status.status is not JobStatus.RUNNING:
            return None  # the job is over: nothing to negotiate
        self.meter.observe(now, sum(status.done_rows), status.world_size, status.generation)
        if not self.view.healthy():
            if not self.holding:
                log.warning("cluster view is not current (API unreachable?): holding %d trainers",
                            status.desired_trainers)
                self.reason = SizeReason(SizeCause.HELD_API_AWAY, f"held at {status.desired_trainers}: the "
                                         "sidecar's view of the cluster is not current (the API is away)")
                self.master.scale(status.desired_trainers, status.node_hints, self.reason, ())  # releases none
            self.holding = True
            return None
        self.holding = False
        pods = self.view.pods() if leading else []
        mine = self.demand(status, pods)
        try:
            line = None
            if leading:
                lines = self._plan(now, mine, pods)
                if self.view.publish_plan(lines, now):  # else another sidecar took the namespace meanwhile
                    line = lines[mine.name]
            else:
                line = self.view.plan_line(mine.name, now)
            if line is None:
                line = PlanLine(status.desired_trainers, status.node_hints,
                                SizeReason(SizeCause.HELD_NO_PLAN, f"held at {status.desired_trainers}: the sidecar that "
                                                                   "decides for the namespace has not planned this job yet"))
            return self._apply(now, status, mine, line)
        finally:
            # After the decision, so that the Lease carries its reason; whatever the decision raised.
            self.view.publish(mine, now, self.reason)

    def _plan(self, now: float, mine: JobDemand, pods: list[Pod]) -> dict[str, PlanLine]:
        """Every job's line of one plan, over the demands the view holds and ours (the freshest). A job's
        priority is its trainers' as the scheduler resolved it, where this sidecar sees them."""
        totals = self.view.totals()  # its trainers alone, where the view keeps them apart
        trainers = [p for job_pods in totals.trainers.values() for p in job_pods] if totals is not None else pods
        self._priorities = trainer_priorities(trainers, self._priorities)
        peers = {d.name: d for d in self.view.peer_demands(now)}
        peers[mine.name] = mine  # our freshest figures, whatever the cache holds
        jobs = tuple(with_priorities(sorted(peers.values(), key=lambda d: d.name), self._priorities))
        snapshot = Snapshot(tuple(self.view.nodes()), tuple(pods), jobs, now, totals)
        plan = self.policy.plan(snapshot)
        self.decisions += 1
        return {d.name: PlanLine(size := max(d.min, min(d.max, plan.sizes.get(d.name, d.current))),
                                 plan.nodes.get(d.name, ())[:size], self.policy.explain(snapshot, plan, d.name), now)
                for d in jobs}

    def _apply(self, now: float, status: JobView, mine: JobDemand, line: PlanLine) -> int | None:
        """Set our job's size from its line of the plan, unless trainers could not be scheduled lately."""
        target = max(self.cfg.min, min(self.cfg.max, line.size))
        reason = line.reason
        if status.unschedulable_at is not None and status.unschedulable_at != self._blocked_report:
            # A new report, timed on this sidecar's clock: the master's is its own (monotonic) one.
            self._blocked_report, self._blocked_since = status.unschedulable_at, now
        blocked_at = self._blocked_since
        hold_s = UNSCHEDULABLE_BACKOFF_PERIODS * self.cfg.period_s
        if blocked_at is not None and now - blocked_at < hold_s and target > mine.current:
            # The launcher just gave up on Pending trainers: the snapshot overstates what fits
            # (taints, affinity, fragmentation the policy does not see). Do not grow for a while.
            target = mine.current
            reason = SizeReason(SizeCause.HELD_UNSCHEDULABLE,
                                f"held at {target} for {blocked_at + hold_s - now:.0f} s more: trainers could not be "
                                f"scheduled lately (the plan wanted more: {reason.text})")
        self.reason = reason
        # Where the plan puts our trainers: the launcher turns the nodes none of them holds yet into
        # preferred node affinities of the trainers it creates next.
        nodes = line.nodes[:target]
        # Trainers told to stop wait for a decision made after they left to be replaced: this one releases
        # those this sidecar saw held before the plan was made (no plan: none), and says an unchanged size
        # for them too.
        self._held_since = {h: self._held_since.get(h, now) for h in status.held_replacements}
        held = tuple(sorted(h for h, seen in self._held_since.items() if seen <= line.at))
        if target == mine.current:
            if nodes != status.node_hints or reason != status.reason or held:
                self.master.scale(target, nodes, reason, held)
            return None
        log.info("scale %s: %d -> %d trainers (policy %s): %s", self.cfg.job, mine.current, target, self.policy.name,
                 reason.text)
        self.master.scale(target, nodes, reason, held)
        if target < mine.current:
            self.meter.forget_above(target)
        return target

    def run(self, stop: Callable[[], bool], sleep: Callable[[float], object] = time.sleep) -> None:
        sleep(job_offset(self.cfg.job, self.cfg.jitter_s))
        while not stop():
            started = self.clock()
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - one bad round must not kill the sidecar: hold and retry
                log.warning("decision failed, holding the current size: %s", str(e).splitlines()[0] if str(e) else e)
            sleep(max(0.0, self.cfg.period_s - (self.clock() - started)))
