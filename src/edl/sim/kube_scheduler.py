"""kube-scheduler's default profile, as far as the simulated pods reach it (pure, numpy).

Checked against kube-scheduler v1.37.2 (``pkg/scheduler``, the plane's own build):

- which nodes are looked at: filtering starts where the previous pod's stopped and ends
  once ``numFeasibleNodesToFind`` nodes pass (all of them below 100 nodes; else
  ``percentageOfNodesToScore`` %, adaptive by default: ``50 - nodes/125``, at least 5 % and
  100 nodes); only those are scored (``schedule_one.go``). A preferred node outside them is
  not preferred: this is why a hint is followed only as far as the real scheduler would;
- filter: the pod's requests fit the node's free allocatable (NodeResourcesFit);
- score, each plugin 0..100 times its weight (``apis/config/v1/default_plugins.go``):
  NodeAffinity x2 (the preferred terms' weights, normalised to the best node's),
  NodeResourcesFit x1 (LeastAllocated over CPU and memory; ``pack``: MostAllocated),
  NodeResourcesBalancedAllocation x1 (its v1.37 form: 50 + (50 + with - without) / 2).
  TaintToleration, ImageLocality, InterPodAffinity and PodTopologySpread score every node
  alike here (no PreferNoSchedule taints, one image, no pod affinity; trainers belong to no
  Service or ReplicaSet, so the system's default spreading does not apply to them);
- ties: one of the best at random (``selectHost``).

Integer arithmetic as the real plugins do it (millicores and MiB), so ties are as common.
"""

from __future__ import annotations

import numpy as np

MIN_FEASIBLE_NODES = 100
MIN_FEASIBLE_PERCENT = 5
NODE_AFFINITY_WEIGHT = 2
FIT_WEIGHT = 1
BALANCED_WEIGHT = 1
MAX_SCORE = 100


def nodes_to_find(percent: int, n: int) -> int:
    """``numFeasibleNodesToFind``: how many feasible nodes the scheduler scores (0: adaptive)."""
    if n < MIN_FEASIBLE_NODES:
        return n
    if percent == 0:
        percent = max(MIN_FEASIBLE_PERCENT, 50 - n // 125)
    return max(MIN_FEASIBLE_NODES, n * percent // 100)


def _units(x: np.ndarray) -> np.ndarray:
    """Cores and GiB as the API counts them: millicores and MiB, whole numbers."""
    return np.rint(x[..., :2] * np.array([1000.0, 1024.0])).astype(np.int64)


def _balanced(requested: np.ndarray, alloc: np.ndarray) -> np.ndarray:
    frac = np.minimum(1.0, requested / np.maximum(alloc, 1))
    std = np.abs(frac[:, 0] - frac[:, 1]) / 2
    return ((1 - std) * MAX_SCORE).astype(np.int64)


def scores(alloc: np.ndarray, used: np.ndarray, req: np.ndarray, preferred: int | None,
           candidates: np.ndarray, pack: bool = False) -> np.ndarray:
    """The default profile's total score of each candidate node (indices into ``alloc``)."""
    cap = _units(alloc[candidates])
    before = _units(used[candidates])
    after = before + _units(req[None, :])
    if pack:
        fit = (np.minimum(after, cap) * MAX_SCORE) // np.maximum(cap, 1)
    else:
        fit = np.where(after > cap, 0, ((cap - after) * MAX_SCORE) // np.maximum(cap, 1))
    fit = fit.sum(axis=1) // 2
    balanced = MAX_SCORE // 2 + (MAX_SCORE // 2 + _balanced(after, cap) - _balanced(before, cap)) // 2
    affinity = np.zeros(len(candidates), dtype=np.int64)
    if preferred is not None:
        affinity[candidates == preferred] = MAX_SCORE  # one term: normalised, the node scores 100
    return FIT_WEIGHT * fit + BALANCED_WEIGHT * balanced + NODE_AFFINITY_WEIGHT * affinity


class Scheduler:
    """Which node a pod goes to: filter from a rotating start, score, pick among the best."""

    def __init__(self, percent_of_nodes_to_score: int = 0, pack: bool = False) -> None:
        self.percent = percent_of_nodes_to_score
        self.pack = pack
        self.next_start = 0

    def pick(self, alloc: np.ndarray, used: np.ndarray, req: np.ndarray, preferred: int | None,
             choose) -> int | None:
        """A node for a pod of ``req`` preferring ``preferred``, or ``None`` if none fits.
        ``choose(n)`` draws an index below ``n`` (the scheduler's random tie-break)."""
        n = len(alloc)
        fits = np.all(alloc - used + 1e-9 >= req, axis=1)
        order = (np.arange(n) + self.next_start) % n
        feasible = np.flatnonzero(fits[order])
        want = nodes_to_find(self.percent, n)
        processed = int(feasible[want - 1]) + 1 if len(feasible) >= want else n
        self.next_start = (self.next_start + processed) % n
        if not len(feasible):
            return None
        candidates = order[feasible[:want]]
        total = scores(alloc, used, req, preferred, candidates, self.pack)
        best = candidates[total == total.max()]
        return int(best[choose(len(best))])
