"""Why a job is at its size: what every policy's explanation reads from a snapshot, as pure functions.

A policy explains only the job its caller asks about (the sidecar its own), after the plan is made:
explaining is never part of the decision, and the simulator, which asks for none, pays nothing.
"""

from __future__ import annotations

import re
from collections import defaultdict

from edl.api.cluster import JobDemand, Pod, SizeCause, SizeReason, Snapshot, may_run_on
from edl.api.policy import Plan
from edl.autoscale.accounting import capacity

# A pod's generated suffixes (a ReplicaSet's hash, the pod's own): what is left names its owner.
_SUFFIX = re.compile(r"(-[a-z0-9]{5})$|(-[a-f0-9]{6,10})$")
SHOWN = 3  # owners named in a reason; the others are counted


def job_of(snapshot: Snapshot, job: str) -> JobDemand:
    for j in snapshot.jobs:
        if j.name == job:
            return j
    raise KeyError(f"job {job!r} is not in the snapshot")


def owner(p: Pod) -> str:
    """Who a pod belongs to, for a person: its job, or its name less the generated suffixes."""
    if p.job is not None:
        return p.job
    name = p.name
    for _ in range(2):
        name = _SUFFIX.sub("", name)
    return name or p.name


def fits(snapshot: Snapshot, j: JobDemand, total: int) -> bool:
    """Whether ``total`` trainers of ``j`` fit on the nodes it may run on, its own trainers left out (as the
    policies plan them), after every other pod bound there and the pods of its priority or higher that
    wait for a node (they are placed first)."""
    pending: list[Pod] = []
    cap = capacity(snapshot, frozenset({j.name}), pending)
    for p in sorted((p for p in pending if p.priority >= j.priority), key=lambda p: (-p.priority, p.name)):
        cap.place(p.requests)
    if j.trainer.cpu > 0 and j.name not in cap.eligible:  # one shape, any node: a count (``count_fits``)
        return cap.count_fits(j.trainer) >= total
    return all(cap.place(j.trainer, job=j.name) is not None for _ in range(total))


def describe(pods: list[Pod]) -> str:
    """``owner (n pods, c CPU), ...``: the largest owners first, by CPU requested."""
    cpu: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for p in pods:
        cpu[owner(p)] += p.requests.cpu
        count[owner(p)] += 1
    ranked = sorted(cpu, key=lambda o: (-cpu[o], o))
    parts = [f"{o} ({count[o]} pod{'s' if count[o] != 1 else ''}, {cpu[o]:g} CPU)" for o in ranked[:SHOWN]]
    if len(ranked) > SHOWN:
        parts.append(f"{len(ranked) - SHOWN} more")
    return ", ".join(parts)


def higher_priority(snapshot: Snapshot, j: JobDemand) -> list[Pod]:
    """The live pods of a higher priority than ``j``'s that wait for a node or hold one it may use."""
    usable = {n.name for n in snapshot.nodes if may_run_on(j, n)}
    return [p for p in snapshot.pods if p.priority > j.priority and not p.phase.terminated
            and (p.node is None or p.node in usable)]


def holders(snapshot: Snapshot, j: JobDemand) -> str:
    """Who holds the nodes ``j`` may run on (its own trainers left out)."""
    usable = {n.name for n in snapshot.nodes if may_run_on(j, n)}
    if not usable:
        return "no node it may run on (node selector, taints)"
    held = [p for p in snapshot.pods if p.node in usable and not p.phase.terminated
            and not (p.job == j.name and p.role == "trainer")]
    return describe(held) if held else "nothing but its own trainers"


def plain(j: JobDemand, size: int, snapshot: Snapshot) -> SizeReason | None:
    """The reasons every policy shares: waiting for its minimum, growing, at its maximum."""
    if j.current <= size <= j.min and not fits(snapshot, j, j.min):  # a shrink says whom it was for
        return SizeReason(SizeCause.WAITING, f"waiting for room for its minimum of {j.min} trainer"
                                             f"{'s' if j.min != 1 else ''}; the nodes hold {holders(snapshot, j)}")
    if size > j.current:
        top = " (its maximum)" if size >= j.max else ""
        return SizeReason(SizeCause.GROWING, f"growing {j.current} -> {size}{top}: there is room for it")
    if size >= j.max:
        return SizeReason(SizeCause.AT_MAX, f"at its maximum of {j.max} trainer{'s' if j.max != 1 else ''}")
    return None


def shrunk_or_full(j: JobDemand, size: int, snapshot: Snapshot, plan: Plan, room: bool | None = None
                   ) -> SizeReason | None:
    """A shrink (to higher-priority pods, or to jobs that gain more), or no room for one more trainer
    (``room``: whether one more fits, when the caller asked already)."""
    current = {d.name: d.current for d in snapshot.jobs}
    gainers = sorted(name for name, n in plan.sizes.items() if name != j.name and n > current.get(name, n))
    if size < j.current:
        above = higher_priority(snapshot, j)
        if above:
            return SizeReason(SizeCause.HANDED_BACK, f"handed {j.current - size} trainer(s) back to pods of a higher "
                                                     f"priority: {describe(above)}")
        return SizeReason(SizeCause.SHARED, f"gives {j.current - size} trainer(s) to jobs that gain more from them"
                                            + (f": {', '.join(gainers)}" if gainers else ""))
    if not (fits(snapshot, j, size + 1) if room is None else room):
        return SizeReason(SizeCause.NO_ROOM, f"no room for another trainer ({j.trainer.cpu:g} CPU); the nodes it "
                                             f"may run on hold {holders(snapshot, j)}")
    if gainers:
        return SizeReason(SizeCause.SHARED, f"the free room goes to jobs that gain more from it: {', '.join(gainers)}")
    return None
