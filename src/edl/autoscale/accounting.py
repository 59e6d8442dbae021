"""Cluster accounting shared by the policies: totals and per-node free capacity.

Placement is the hot path of a decision (thousands of trainers over thousands of
nodes), so free capacity lives in plain lists and each trainer shape keeps a heap
of candidate nodes ordered by free CPU (best fit), checked lazily.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from edl.api.cluster import Pod, PodPhase, Resources, Snapshot, may_run_on

_TERMINATED = (PodPhase.SUCCEEDED, PodPhase.FAILED)
GIB = float(2 ** 30)
EPS = 1e-9
WASTE_LOOKAHEAD = 8  # how many best fits ``place`` weighs against the waste each would leave
GPU_NODE_LAST = 1e9  # added to a GPU node's free CPU when ordering nodes for a pod that needs no GPU


def best_fill(room: float, shapes: Sequence[float]) -> float:
    """The most CPU that whole pods of the ``shapes`` (cores, any number of each) take of ``room`` cores.

    Counted in millicores, as the API does, over their greatest common divisor: reachable sums are the
    bits of one integer, and each shape's multiples are added by doubling shifts (exact, and fast for
    any node size)."""
    units = [int(round(s * 1000)) for s in shapes if s > 0]
    if not units or room <= 0:
        return 0.0
    g = math.gcd(*units)
    top = int(round(room * 1000)) // g
    mask = (1 << (top + 1)) - 1
    reach = 1  # bit k: k * g millicores can be filled exactly
    for u in sorted({u // g for u in units}):
        step = u
        while step <= top:
            reach = (reach | (reach << step)) & mask
            step *= 2
    return (reach.bit_length() - 1) * g / 1000


@dataclass
class Capacity:
    """Allocatable and requested totals, and free capacity per node (in node-name order)."""

    names: list[str]
    free_cpu: list[float]
    free_mem: list[float]
    free_gpu: list[float]
    total: Resources
    requested: Resources  # all non-terminated pods counted, pending included
    # Best-fit heaps per trainer shape (cpu, memory, gpu), and per (shape, job) for a job with eligible nodes.
    _heaps: dict[tuple, list[tuple[float, int]]] = field(default_factory=dict)
    _gpu_offset: list[float] | None = None
    _gpu_offset_known: bool = False
    # Jobs whose trainers may go to some nodes only (selector, tolerations): the node indices they may.
    eligible: dict[str, frozenset[int]] = field(default_factory=dict)

    def _fits(self, i: int, cpu: float, mem: float, gpu: float) -> bool:
        return self.free_cpu[i] + EPS >= cpu and self.free_mem[i] + EPS >= mem and self.free_gpu[i] + EPS >= gpu

    def place(self, req: Resources, waste_below: float = 0.0, job: str | None = None) -> int | None:
        """Bind one pod of ``req`` to the fitting node with the least free CPU; ``None`` if none fits.

        A pod that needs no GPU goes to a node with GPUs only when no other node holds it: a CPU
        trainer there takes the cores the GPU jobs need (best fit alone prefers those nodes when
        they are the smaller ones).

        ``waste_below``: CPU left on a node below this is waste (no pod of the cluster's shapes fits
        it). Of the ``WASTE_LOOKAHEAD`` best fits, the first that leaves no waste (nothing, or at least
        that much) is taken; if none does, the best fit.

        ``job``: a trainer of this job, which goes only where it may (``eligible``)."""
        if waste_below > 0:
            return self._place_least_waste(req, waste_below, job)
        allowed = self.eligible.get(job) if job is not None else None
        fit = (req.cpu, req.memory, req.gpu)
        key = fit if allowed is None else (*fit, job)
        heap = self._heaps.get(key)
        free_cpu = self.free_cpu
        off = None if req.gpu > 0 else self._gpu_offsets()
        if heap is None:
            heap = [(free_cpu[i] + (off[i] if off else 0.0), i) for i in (range(len(self.names)) if allowed is None
                                                                          else sorted(allowed)) if self._fits(i, *fit)]
            heapq.heapify(heap)
            self._heaps[key] = heap
        # The hot loop of a decision (a place per trainer): the fit test inlined, on local names.
        free_mem, free_gpu = self.free_mem, self.free_gpu
        cpu, mem, gpu = req.cpu, req.memory, req.gpu
        while heap:
            cpu_at_push, i = heap[0]
            if free_cpu[i] + EPS < cpu or free_mem[i] + EPS < mem or free_gpu[i] + EPS < gpu:
                heapq.heappop(heap)
                continue
            now = free_cpu[i] + off[i] if off else free_cpu[i]
            if cpu_at_push != now:  # changed by another shape: re-file it
                heapq.heapreplace(heap, (now, i))
                continue
            free_cpu[i] -= req.cpu
            free_mem[i] -= req.memory
            free_gpu[i] -= req.gpu
            if free_cpu[i] + EPS < cpu or free_mem[i] + EPS < mem or free_gpu[i] + EPS < gpu:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (free_cpu[i] + off[i] if off else free_cpu[i], i))
            return i
        return None

    def count_fits(self, req: Resources) -> int:
        """How many pods of ``req`` (some CPU) fit on the nodes as they are: each node holds whole pods,
        so for one shape the count does not depend on the order they are placed in."""
        each = np.floor((np.asarray(self.free_cpu) + EPS) / req.cpu)
        for free, r in ((np.asarray(self.free_mem), req.memory), (np.asarray(self.free_gpu), req.gpu)):
            if r > 0:
                each = np.minimum(each, np.floor((free + EPS) / r))
            else:
                each[free + EPS < 0] = 0  # over-committed there: nothing fits, as ``place`` finds
        return int(np.maximum(each, 0).sum())

    def place_nominated(self, pod: Pod) -> int | None:
        """Bind a waiting pod to the node the scheduler nominated for it (``Pod.nominated``) if it fits
        there now; ``None`` if it has none, or that node is not counted or full."""
        if pod.nominated is None:
            return None
        i = self.node_index(pod.nominated)
        r = pod.requests
        if i is None or not self._fits(i, r.cpu, r.memory, r.gpu):
            return None
        self.take(i, r)
        return i

    def node_index(self, name: str) -> int | None:
        """A node's index (``names`` is sorted); ``None`` for a node not counted."""
        i = bisect.bisect_left(self.names, name)
        return i if i < len(self.names) and self.names[i] == name else None

    def place_spread(self, req: Resources) -> int | None:
        """Bind one pod of ``req`` to the fitting node with the most free CPU (what kube-scheduler's
        default LeastAllocated scoring prefers for a pod without a preferred node); ``None`` if none fits.
        A lazy max-heap per shape, as ``place`` keeps for best fit."""
        fit = (req.cpu, req.memory, req.gpu)
        key = ("spread", *fit)
        heap = self._heaps.get(key)
        free_cpu = self.free_cpu
        if heap is None:
            heap = [(-free_cpu[i], i) for i in range(len(self.names)) if self._fits(i, *fit)]
            heapq.heapify(heap)
            self._heaps[key] = heap
        while heap:
            neg, i = heap[0]
            if not self._fits(i, *fit):
                heapq.heappop(heap)
                continue
            if -neg != free_cpu[i]:  # changed since it was filed: re-file it
                heapq.heapreplace(heap, (-free_cpu[i], i))
                continue
            free_cpu[i] -= req.cpu
            self.free_mem[i] -= req.memory
            self.free_gpu[i] -= req.gpu
            if self._fits(i, *fit):
                heapq.heapreplace(heap, (-free_cpu[i], i))
            else:
                heapq.heappop(heap)
            return i
        return None

    def place_many(self, req: Resources, count: int, waste_below: float = 0.0, job: str | None = None) -> list[int]:
        """``place`` up to ``count`` times; a node chosen is filled while it holds more (what repeated best
        fit does, as the node stays the fullest that fits), at one heap look-up per node, not per pod.
        The heaps are lazy: entries of a node whose free space shrank are re-filed when next seen."""
        out: list[int] = []
        while len(out) < count:
            i = self.place(req, waste_below, job)
            if i is None:
                break
            out.append(i)
            while len(out) < count and self._fits(i, req.cpu, req.memory, req.gpu):
                left = self.free_cpu[i] - req.cpu
                if waste_below > 0 and EPS <= left and left + EPS < waste_below:
                    break  # the next one would leave waste here: let ``place`` look again
                self.free_cpu[i] = left
                self.free_mem[i] -= req.memory
                self.free_gpu[i] -= req.gpu
                out.append(i)
        return out

    def _place_least_waste(self, req: Resources, waste_below: float, job: str | None) -> int | None:
        seen: list[int] = []  # best fits taken one after the other (a node may come twice)
        chosen = None
        while len(seen) < WASTE_LOOKAHEAD:
            i = self.place(req, job=job)
            if i is None:
                break
            seen.append(i)
            left = self.free_cpu[i]
            if left < EPS or left + EPS >= waste_below:
                chosen = len(seen) - 1
                break
        if not seen:
            return None
        if chosen is None:
            chosen = 0
        for k in reversed(range(len(seen))):  # hand back every take but the chosen one
            if k != chosen:
                self.release(seen[k], req)
        return seen[chosen]

    def place_packed(self, req: Resources, fill: Sequence[float]) -> int | None:
        """Bind one pod of ``req`` to the fitting node where it leaves the least CPU that pods of the
        ``fill`` shapes could not use (``best_fill``), best fit among those; ``None`` if none fits.

        For a job's fixed pods (parameter servers, a master): best fit alone drops them into whatever
        hole is tightest, and the cores left beside them are often too few for a trainer (a 4-core pod
        on a node with 7.65 free strands 3.65 that no 5-core trainer can use; on a node with 12.65 free,
        two more fixed pods or a trainer and a fixed pod fill it). Pods that need no GPU go to GPU nodes
        last, as in ``place``."""
        cpu, mem, gpu = (np.asarray(x) for x in (self.free_cpu, self.free_mem, self.free_gpu))
        fits = np.flatnonzero((cpu + EPS >= req.cpu) & (mem + EPS >= req.memory) & (gpu + EPS >= req.gpu))
        if not len(fits):
            return None
        left = np.round(cpu[fits] - req.cpu, 6)
        values, where = np.unique(left, return_inverse=True)
        waste = np.round(values - np.array([best_fill(float(v), fill) for v in values]), 6)[where]
        off = self._gpu_offsets() if req.gpu <= 0 else None
        gpu_last = np.zeros(len(fits)) if off is None else (np.asarray(off)[fits] > 0).astype(float)
        i = int(fits[np.lexsort((fits, left, waste, gpu_last))[0]])
        self.take(i, req)
        return i

    def _gpu_offsets(self) -> list[float] | None:
        """Per node, what is added to free CPU in the heap order of pods that need no GPU: nodes with
        GPUs sort after every other node. ``None`` on a cluster without GPUs."""
        if not self._gpu_offset_known:
            offsets = [GPU_NODE_LAST if g > EPS else 0.0 for g in self.free_gpu]
            self._gpu_offset = offsets if any(offsets) else None
            self._gpu_offset_known = True
        return self._gpu_offset

    def take(self, node: int, req: Resources) -> None:
        """Count a pod already bound to ``node`` (one the policy keeps where it is)."""
        self.free_cpu[node] -= req.cpu
        self.free_mem[node] -= req.memory
        self.free_gpu[node] -= req.gpu
        self._heaps.clear()  # rebuilt lazily by the next ``place``: taking is rare next to placing

    def release(self, node: int, req: Resources) -> None:
        self.free_cpu[node] += req.cpu
        self.free_mem[node] += req.memory
        self.free_gpu[node] += req.gpu
        off = self._gpu_offsets()
        for key, heap in self._heaps.items():
            if key[0] == "spread":
                if self._fits(node, *key[1:]):
                    heapq.heappush(heap, (-self.free_cpu[node], node))
                continue
            if len(key) > 3 and node not in self.eligible[key[3]]:
                continue  # a heap of one job's nodes: not this one
            if self._fits(node, *key[:3]):
                heapq.heappush(heap, (self.free_cpu[node] + (off[node] if off and key[2] <= 0 else 0.0), node))

    def saved(self) -> tuple[list[float], list[float], list[float]]:
        """The free capacity as it is now, for ``restore``."""
        return list(self.free_cpu), list(self.free_mem), list(self.free_gpu)

    def restore(self, saved: tuple[list[float], list[float], list[float]]) -> None:
        """Free capacity back to what ``saved`` took: every place, take and release since undone."""
        self.free_cpu[:], self.free_mem[:], self.free_gpu[:] = saved
        self._heaps.clear()  # rebuilt lazily by the next ``place``

    def copy(self) -> "Capacity":
        return Capacity(self.names, list(self.free_cpu), list(self.free_mem), list(self.free_gpu), self.total,
                        self.requested, eligible=self.eligible)


def capacity(snapshot: Snapshot, planned: frozenset[str] | None = None,
             pending: list[Pod] | None = None, bound: dict[str, list[str]] | None = None,
             shapes: set[float] | None = None, running: set[str] | None = None) -> Capacity:
    """Free capacity after the non-terminated pods bound to each node.

    With ``planned`` (the jobs whose trainers the caller is planning), those trainers are
    left out, and so are pods still waiting for a node, which go to ``pending`` instead;
    ``bound`` collects, per planned job, the nodes its left-out trainers are bound to, and
    ``shapes`` the CPU requests of the jobs' other pods (fixed pods), and ``running`` the planned
    jobs with a trainer running.
    One pass over the pods, the hot loop of a decision on a large cluster; with the snapshot's
    ``totals``, one pass over the nodes with load, the trainers and the waiting pods instead.
    """
    nodes = sorted(snapshot.nodes, key=lambda n: n.name)
    names = [n.name for n in nodes]
    eligible = {j.name: frozenset(i for i, n in enumerate(nodes) if may_run_on(j, n))
                for j in snapshot.jobs if j.node_selector or j.tolerations}
    index = {n: i for i, n in enumerate(names)}
    free_cpu = [n.allocatable.cpu for n in nodes]
    free_mem = [n.allocatable.memory for n in nodes]
    free_gpu = [n.allocatable.gpu for n in nodes]
    total = Resources(sum(free_cpu), sum(free_mem), sum(free_gpu))
    rc = rm = rg = 0.0
    waiting = PodPhase.PENDING
    totals = snapshot.totals
    pods: tuple[Pod, ...] | list[Pod] = snapshot.pods
    if totals is not None:
        # The sums the observer keeps: the pods other than trainers per node; the trainers and the
        # waiting pods one by one below (a decision's cost grows with them, not with the cluster's pods).
        for loaded, (c, m, g) in totals.load.items():
            i = index.get(loaded)
            if i is not None:
                free_cpu[i] -= c / 1000
                free_mem[i] -= m / GIB
                free_gpu[i] -= g / 1000
        rc, rm, rg = totals.requested[0] / 1000, totals.requested[1] / GIB, totals.requested[2] / 1000
        if shapes is not None:
            shapes |= totals.shapes
        pods = [p for mine in totals.trainers.values() for p in mine]
        if planned is None:
            pods += totals.waiting
        elif pending is not None:
            pending += totals.waiting
    for p in pods:
        phase = p.phase
        if phase in _TERMINATED:
            continue
        if planned is not None:
            if p.job is not None and p.role == "trainer" and p.job in planned:
                if bound is not None and p.node is not None:
                    bound.setdefault(p.job, []).append(p.node)
                if running is not None and phase is PodPhase.RUNNING:
                    running.add(p.job)
                continue
            if phase is waiting and p.node is None:
                if pending is not None:
                    pending.append(p)
                continue
        r = p.requests
        if shapes is not None and p.job is not None:
            shapes.add(r.cpu)  # pods that come back with every job of their kind
        rc += r.cpu
        rm += r.memory
        rg += r.gpu
        node = p.node
        if node is not None:
            i = index.get(node)
            if i is not None:
                free_cpu[i] -= r.cpu
                free_mem[i] -= r.memory
                free_gpu[i] -= r.gpu
    return Capacity(names, free_cpu, free_mem, free_gpu, total, Resources(rc, rm, rg), eligible=eligible)


def pods_by_job(pods: tuple[Pod, ...]) -> dict[str, list[Pod]]:
    out: dict[str, list[Pod]] = {}
    for p in pods:
        if p.job is not None and p.phase not in _TERMINATED:
            out.setdefault(p.job, []).append(p)
    return out
