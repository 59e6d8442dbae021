"""Cluster accounting shared by the policies: totals and per-node free capacity."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edl.autoscale.model import Pod, Resources, Snapshot


@dataclass
class Capacity:
    """Allocatable and requested totals, and free capacity per node (arrays in node-name order)."""

    names: list[str]
    alloc: np.ndarray  # shape (n, 3): cpu, memory, gpu
    used: np.ndarray  # requests of non-terminated pods bound to each node
    total: Resources
    requested: Resources  # all non-terminated pods, pending included

    @property
    def free(self) -> np.ndarray:
        return self.alloc - self.used

    def place(self, req: Resources, best_fit: bool = True) -> int | None:
        """Bind one pod of ``req`` to a node (best fit on CPU, or first fit); ``None`` if none fits."""
        need = np.array([req.cpu, req.memory, req.gpu])
        free = self.free
        fits = np.all(free + 1e-9 >= need, axis=1)
        if not fits.any():
            return None
        if best_fit:
            i = int(np.argmin(np.where(fits, free[:, 0], np.inf)))
        else:
            i = int(np.argmax(fits))
        self.used[i] += need
        return i

    def release(self, node: int, req: Resources) -> None:
        self.used[node] -= np.array([req.cpu, req.memory, req.gpu])


def capacity(snapshot: Snapshot, include=lambda pod: True) -> Capacity:
    nodes = sorted(snapshot.nodes, key=lambda n: n.name)
    names = [n.name for n in nodes]
    index = {n: i for i, n in enumerate(names)}
    alloc = np.array([[n.allocatable.cpu, n.allocatable.memory, n.allocatable.gpu] for n in nodes], dtype=float)
    if alloc.size == 0:
        alloc = np.zeros((0, 3))
    used = np.zeros_like(alloc)
    req = [0.0, 0.0, 0.0]
    for p in snapshot.pods:
        if p.phase.terminated or not include(p):
            continue
        r = p.requests
        req[0] += r.cpu
        req[1] += r.memory
        req[2] += r.gpu
        i = index.get(p.node) if p.node is not None else None
        if i is not None:
            used[i, 0] += r.cpu
            used[i, 1] += r.memory
            used[i, 2] += r.gpu
    total = Resources(*alloc.sum(axis=0)) if len(names) else Resources()
    return Capacity(names, alloc, used, total, Resources(*req))


def pods_by_job(pods: tuple[Pod, ...]) -> dict[str, list[Pod]]:
    out: dict[str, list[Pod]] = {}
    for p in pods:
        if p.job is not None and not p.phase.terminated:
            out.setdefault(p.job, []).append(p)
    return out
