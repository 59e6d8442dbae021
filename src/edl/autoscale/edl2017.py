"""``edl2017``: a faithful port of PaddlePaddle EDL's 2017 autoscaler (go/autoscaler/autoscaler.go).

Every period it sums allocatable resources and the requests of all
non-terminated pods (pending included). Jobs are considered only when all their
pods are Running, unless some job is entirely pending (then all are, so that
room can be made). Elastic jobs are sorted by fulfillment
``(current - min) / (max - min)`` ascending, ties by smaller GPU, CPU, memory
request. Then rounds repeat until nothing changes: in that order each job grows
by one if it is below max, there is memory for one more trainer, some node has
the CPU and memory free for it, and total CPU requests stay within 97 % of
allocatable (GPUs may fill to 100 %); then, in reverse order, each shrinks by one
if above max, or if CPU or GPU requests exceed 97 % and it is above min.
There are no priorities: other pods only count as load.
"""

from __future__ import annotations

from edl.autoscale.accounting import capacity, pods_by_job
from edl.api.cluster import JobDemand, PodPhase, SizeCause, SizeReason, Snapshot
from edl.api.policy import Plan
from edl.autoscale.reasons import job_of, plain, shrunk_or_full

MAX_LOAD = 0.97


def fulfillment(j: JobDemand, current: int) -> float:
    if j.max == j.min:
        return 1.0
    return (current - j.min) / (j.max - j.min)


class Edl2017:
    name = "edl2017"

    def __init__(self, max_load: float = MAX_LOAD) -> None:
        self.max_load = max_load

    @staticmethod
    def remaining_key(jobs) -> tuple:
        return ()  # remaining work plays no part in this policy

    def considered(self, snapshot: Snapshot) -> list[JobDemand]:
        pods = pods_by_job(snapshot.pods)
        running, pending = [], []
        for j in snapshot.jobs:
            ps = pods.get(j.name, [])
            if ps and all(p.phase is PodPhase.RUNNING for p in ps):
                running.append(j)
            elif ps and all(p.phase is PodPhase.PENDING for p in ps):
                pending.append(j)
        return list(snapshot.jobs) if pending else running

    def plan(self, snapshot: Snapshot) -> Plan:
        return Plan(self.decide(snapshot))  # the 2017 autoscaler set counts only; the scheduler placed

    def explain(self, snapshot: Snapshot, plan: Plan, job: str) -> SizeReason:
        """Why ``plan`` gives ``job`` its size: the 2017 rules (97 % of the CPU, one more trainer at a time)."""
        j = job_of(snapshot, job)
        size = plan.sizes.get(job, j.current)
        cap = capacity(snapshot)
        load = cap.requested.cpu / cap.total.cpu if cap.total.cpu > 0 else 1.0
        if j not in self.considered(snapshot) and size == j.current:
            return SizeReason(SizeCause.WAITING, "waits until every one of its pods runs (the 2017 rule)")
        reason = plain(j, size, snapshot)
        if reason is None and size == j.current and load + j.trainer.cpu / max(cap.total.cpu, 1e-9) > self.max_load:
            reason = SizeReason(SizeCause.NO_ROOM, f"CPU requests are {100 * load:.0f} % of the cluster's; one more "
                                                   f"trainer would pass {100 * self.max_load:.0f} %")
        return reason or shrunk_or_full(j, size, snapshot, plan) or SizeReason(
            SizeCause.SHARED, f"stays at {size}: jobs less fulfilled grow first")

    def decide(self, snapshot: Snapshot) -> dict[str, int]:
        cap = capacity(snapshot)
        total, req = cap.total, cap.requested
        cpu_req, mem_req, gpu_req = req.cpu, req.memory, req.gpu
        free_cpu, free_mem = cap.free_cpu, cap.free_mem  # node idle CPU / free memory, in name order
        jobs = self.considered(snapshot)
        first_fit: dict[tuple[float, float], int] = {}
        diff = {j.name: 0 for j in jobs}

        def order() -> list[JobDemand]:
            return sorted(jobs, key=lambda j: (fulfillment(j, j.current + diff[j.name]),
                                               j.trainer.gpu, j.trainer.cpu, j.trainer.memory, j.name))

        while True:
            # The original loops until a round changes nothing. A round can grow a GPU job to
            # 100 % and shrink it again past 97 %: stop when a round's net effect is nil.
            before = dict(diff)
            ranked = order()
            for j in ranked:  # scale up
                planned = j.current + diff[j.name]
                t = j.trainer
                if planned >= j.max:
                    continue
                if total.memory - mem_req <= t.memory:
                    continue
                # "Some node can hold the trainer": the first in name order (Go ranged over a map).
                # Free space only shrinks here, so the first fitting node never moves back.
                shape = (t.cpu, t.memory)
                node = first_fit.get(shape, 0)
                while node < len(free_cpu) and not (t.cpu <= free_cpu[node] + 1e-9 and t.memory <= free_mem[node] + 1e-9):
                    node += 1
                first_fit[shape] = node
                if node >= len(free_cpu):
                    continue
                add_cpu = 1 if total.cpu * self.max_load - cpu_req >= t.cpu - 1e-9 else 0
                if t.gpu > 0:
                    add_gpu = 1 if total.gpu - gpu_req >= t.gpu else 0
                    add = min(add_cpu, add_gpu)
                else:
                    add = add_cpu
                if add:
                    diff[j.name] += 1
                    cpu_req += t.cpu
                    mem_req += t.memory
                    gpu_req += t.gpu
                    free_cpu[node] -= t.cpu
                    free_mem[node] -= t.memory
            for j in reversed(ranked):  # scale down
                planned = j.current + diff[j.name]
                t = j.trainer
                over = gpu_req > total.gpu * self.max_load or cpu_req > total.cpu * self.max_load
                if planned > j.max or (over and planned > j.min):
                    diff[j.name] -= 1
                    cpu_req -= t.cpu
                    mem_req -= t.memory
                    gpu_req -= t.gpu
            if diff == before:
                break
        out = {}
        for j in snapshot.jobs:
            target = j.current + diff.get(j.name, 0)
            out[j.name] = min(max(target, j.min), j.max)
        return out
