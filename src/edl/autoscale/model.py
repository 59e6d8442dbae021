"""What a scaling policy sees: a cluster snapshot and every elastic job's demand.

Plain frozen dataclasses, built by whoever observes the cluster (the sidecar's
informer cache on Kubernetes, the simulator in virtual time). Quantities are
CPU cores, GiB of memory and whole GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


@dataclass(frozen=True)
class Resources:
    cpu: float = 0.0
    memory: float = 0.0
    gpu: float = 0.0

    def __add__(self, o: "Resources") -> "Resources":
        return Resources(self.cpu + o.cpu, self.memory + o.memory, self.gpu + o.gpu)

    def __sub__(self, o: "Resources") -> "Resources":
        return Resources(self.cpu - o.cpu, self.memory - o.memory, self.gpu - o.gpu)

    def scaled(self, k: float) -> "Resources":
        return Resources(self.cpu * k, self.memory * k, self.gpu * k)

    def fits_in(self, o: "Resources", eps: float = 1e-9) -> bool:
        return self.cpu <= o.cpu + eps and self.memory <= o.memory + eps and self.gpu <= o.gpu + eps


class PodPhase(str, Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminated(self) -> bool:
        return self in (PodPhase.SUCCEEDED, PodPhase.FAILED)


@dataclass(frozen=True)
class Node:
    name: str
    allocatable: Resources


@dataclass(frozen=True)
class Pod:
    name: str
    requests: Resources
    phase: PodPhase
    priority: int = 0
    node: str | None = None  # None while unscheduled
    job: str | None = None  # owning elastic job, if any
    role: str = "other"  # "trainer" for elastic trainers; "fixed" for a job's other pods


@dataclass(frozen=True)
class JobDemand:
    """One elastic job as its sidecar publishes it."""

    name: str
    min: int
    max: int
    current: int  # the job's current desired trainer count
    trainer: Resources
    priority: int = 0
    # Optional: measured samples/s with n trainers at index n (index 0 unused, may be 0).
    throughput: tuple[float, ...] = ()
    rescale_cost_s: float = 0.0  # measured pause of one generation change
    remaining: float | None = None  # samples of work left, when the job knows (None: endless)

    def speed(self, n: int) -> float:
        """Throughput with ``n`` trainers: measured where known, linear beyond (conservative)."""
        if n <= 0:
            return 0.0
        t = self.throughput
        if not t or len(t) < 2:
            return float(n)
        if n < len(t):
            return t[n]
        last = len(t) - 1
        per = t[last] / last if last else t[1]
        return t[last] + (n - last) * per * 0.5  # unmeasured: assume diminishing returns


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[Node, ...]
    pods: tuple[Pod, ...]
    jobs: tuple[JobDemand, ...]
    now: float = 0.0
    meta: dict = field(default_factory=dict, compare=False)
