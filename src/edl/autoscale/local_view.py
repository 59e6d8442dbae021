"""The sidecar's view of this machine (the local backend), with other tenants on a schedule.

This machine is one node of ``slots`` trainer-sized slots. Other tenants come and
go by a capacity schedule — ``"0:0,30:2,60:1"`` means from t=30 s two slots are
taken by higher-priority work, from t=60 s one — like the seed experiments'
Nginx, scaled to a laptop. They appear to the policy as running pods of a
higher priority, so the job grows into free slots and hands them back at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from edl.api.cluster import DecidesAlone, JobDemand, Node, Pod, PodPhase, Resources, SizeReason
from edl.errors import UserError

SLOT = Resources(1.0, 1.0, 0.0)
TENANT_PRIORITY = 1000


@dataclass(frozen=True)
class CapacitySchedule:
    steps: tuple[tuple[float, int], ...] = ()  # (seconds since start, slots taken), sorted

    @classmethod
    def parse(cls, text: str, flag: str = "--capacity-schedule") -> "CapacitySchedule":
        steps = []
        for part in filter(None, (p.strip() for p in (text or "").split(","))):
            try:
                at, taken = part.split(":")
                step = (float(at), int(taken))
            except ValueError:
                raise UserError(f"{flag} {text!r}: write TIME:SLOTS pairs, e.g. 0:0,30:2,60:1") from None
            if step[0] < 0 or step[1] < 0:
                raise UserError(f"{flag} {text!r}: times and slots must not be negative")
            steps.append(step)
        if [s[0] for s in steps] != sorted(s[0] for s in steps):
            raise UserError(f"{flag} {text!r}: times must increase")
        return cls(tuple(steps))

    def taken(self, t: float) -> int:
        n = 0
        for at, k in self.steps:
            if at <= t:
                n = k
        return n


class LocalClusterView(DecidesAlone):
    def __init__(self, job: str, slots: int, schedule: CapacitySchedule, started_at: float,
                 clock: Callable[[], float]) -> None:
        self.job = job
        self.slots = slots
        self.schedule = schedule
        self.started_at = started_at
        self.clock = clock
        self.demand: JobDemand | None = None

    def free_slots(self, now: float | None = None) -> int:
        now = self.clock() if now is None else now
        return max(0, self.slots - self.schedule.taken(now - self.started_at))

    def healthy(self) -> bool:
        return True

    def nodes(self) -> list[Node]:
        return [Node("localhost", SLOT.scaled(self.slots))]

    def pods(self) -> list[Pod]:
        taken = min(self.slots, self.schedule.taken(self.clock() - self.started_at))
        return [Pod(f"tenant-{i}", SLOT, PodPhase.RUNNING, TENANT_PRIORITY, "localhost") for i in range(taken)]

    def totals(self) -> None:
        return None  # a few pods: the policy adds them up

    def peer_demands(self, now: float) -> list[JobDemand]:
        return [self.demand] if self.demand is not None else []

    def publish(self, demand: JobDemand, now: float, reason: SizeReason | None = None) -> None:
        self.demand = demand
