"""The scaling policy interface: ``plan(snapshot) -> Plan`` (sizes, and where new trainers go).

Policies are pure and deterministic: the same snapshot gives the same plan, so
the sidecars of different jobs agree without a central controller, and the
simulator runs exactly the code the sidecar runs.

A plan's placement is a hint, not a binding: it travels sidecar -> master -> launcher
and becomes a *preferred* node affinity on each new trainer pod (``edl.cluster.manifests``),
so the real scheduler follows it where the node still has room and goes elsewhere where not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Protocol, Sequence

from edl.api.cluster import SizeReason, Snapshot


@dataclass(frozen=True)
class Plan:
    """Target trainer count per job and, where the policy places trainers, the node of each.

    ``nodes[job]`` lists one node name per trainer of the job's target (sorted; a node appears
    once per trainer on it): the trainers it holds now where they stay, then the new ones. A job
    without an entry has no placement (the scheduler alone decides). ``pods`` names a node for
    each of the jobs' other pods (fixed pods: a master, parameter servers) that waits for one: the
    launcher that creates such a pod gives it that node as its preferred node affinity."""

    sizes: dict[str, int]
    nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    pods: dict[str, str] = field(default_factory=dict)


class Policy(Protocol):
    name: str

    def decide(self, snapshot: Snapshot) -> dict[str, int]:
        """Target trainer count for every job in ``snapshot.jobs``, each within its min..max."""
        ...

    def plan(self, snapshot: Snapshot) -> Plan:
        """``decide``'s sizes and the planned node of every trainer (``Plan.nodes``)."""
        ...

    def explain(self, snapshot: Snapshot, plan: Plan, job: str) -> SizeReason:
        """Why ``plan`` gives ``job`` its size (the plan's own, not one the caller clipped)."""
        ...

    def remaining_key(self, jobs: tuple) -> tuple:
        """What the decision reads of the jobs' remaining work (it changes every instant; the
        plan does not, unless this key does). Lets a caller skip a decision that cannot differ."""
        ...


def free_hints(planned: Iterable[str], taken: Iterable[str | None]) -> list[str]:
    """The planned nodes no trainer of the job has yet: ``planned`` less ``taken`` (as multisets).

    ``taken`` holds, per live trainer, the node it is bound to or else the node it was hinted to
    (``None``: neither). The launcher and the simulator give new trainers these, in order."""
    left = Counter(planned)
    left.subtract(n for n in taken if n is not None)
    return sorted(left.elements())


def leaving(count: int, planned: Iterable[str], trainers: Sequence[tuple[str, str | None]]) -> list[str]:
    """Which ``count`` of a job's live trainers go when it shrinks: first those the plan does not keep.

    ``trainers``: (name, node bound to or ``None``) in the order the caller would let them go without a
    plan (its own preference: not yet running first, then the youngest). A planned node keeps as many
    trainers as it appears in ``planned``, the ones the caller would let go last; every other trainer
    goes first, in the caller's order, then the kept ones if more must go. Without a plan this is the
    caller's order: the launcher and the simulator drain the same trainers."""
    slots = Counter(planned)
    kept: set[str] = set()
    for name, node in reversed(trainers):
        if node is not None and slots[node] > 0:
            slots[node] -= 1
            kept.add(name)
    order = [name for name, _ in trainers if name not in kept] + [name for name, _ in trainers if name in kept]
    return order[:max(0, count)]
