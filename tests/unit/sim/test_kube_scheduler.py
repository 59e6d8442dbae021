"""The simulator's kube-scheduler default profile: how far a preferred node is followed."""

from __future__ import annotations

import random

import numpy as np

from edl.sim.kube_scheduler import Scheduler, nodes_to_find, scores


def cluster(n: int, cpu: float = 16, mem: float = 64) -> tuple[np.ndarray, np.ndarray]:
    return np.tile([cpu, mem, 0.0], (n, 1)), np.zeros((n, 3))


REQ = np.array([5.0, 8.0, 0.0])


def test_without_a_preference_it_spreads_and_with_one_it_goes_there_while_the_node_has_room():
    alloc, used = cluster(3)
    used[0] = [8, 8, 0]  # the fullest node
    pick = Scheduler().pick
    assert pick(alloc, used, REQ, None, random.Random(0).randrange) in (1, 2)  # LeastAllocated: an empty one
    assert pick(alloc, used, REQ, 0, random.Random(0).randrange) == 0  # NodeAffinity x2 outweighs the spread
    used[0] = [12, 8, 0]
    assert pick(alloc, used, REQ, 0, random.Random(0).randrange) in (1, 2)  # no room: elsewhere, never Pending


def test_the_preference_outweighs_both_resource_scores_at_their_extremes():
    alloc, used = cluster(2)
    used[0] = [10.9, 50, 0]  # nearly full and unbalanced: the lowest resource scores
    total = scores(alloc, used, REQ, 0, np.arange(2))
    assert total[0] > total[1]


def test_on_large_clusters_only_some_nodes_are_scored_so_a_preferred_node_can_be_missed():
    assert nodes_to_find(0, 50) == 50 and nodes_to_find(0, 133) == 100 and nodes_to_find(0, 5000) == 500
    assert nodes_to_find(100, 5000) == 5000
    alloc, used = cluster(200)
    missed = {Scheduler().pick(alloc, used, REQ, 150, random.Random(k).randrange) != 150 for k in range(3)}
    assert missed == {True}  # a fresh scheduler scores nodes 0..99 first: node 150 is not looked at
    assert Scheduler(100).pick(alloc, used, REQ, 150, random.Random(0).randrange) == 150
