"""``PodLedger``: the sums a decision reads, kept as pods change, give what adding up every pod gives."""

from __future__ import annotations

import random

import pytest

from edl.api.cluster import JobDemand, Node, Pod, PodPhase, Resources, Snapshot
from edl.api.ledger import PodLedger
from edl.autoscale.accounting import capacity
from edl.autoscale.policy import get_policy

NODES = tuple(Node(f"n{i}", Resources(31.5, 128, 1 if i % 7 == 0 else 0)) for i in range(12))
JOBS = ("a", "b", "c")


def random_pod(rng: random.Random, name: str) -> Pod:
    phase = rng.choice([PodPhase.PENDING, PodPhase.RUNNING, PodPhase.RUNNING, PodPhase.SUCCEEDED, PodPhase.FAILED])
    node = None if phase is PodPhase.PENDING and rng.random() < 0.6 else rng.choice(NODES).name
    kind = rng.random()
    job = rng.choice(JOBS) if kind < 0.6 else None
    role = "trainer" if job and kind < 0.45 else ("fixed" if job else "other")
    req = Resources(rng.choice([0.1, 0.25, 1, 2, 4]), rng.choice([0.5, 1, 2.5]), 1 if rng.random() < 0.05 else 0)
    return Pod(name, req, phase, rng.choice([0, 10, 1000]), node, job, role,
               nominated=rng.choice([None, "n3"]) if node is None else None)


def churned(seed: int, steps: int = 3000) -> tuple[PodLedger, dict[str, Pod]]:
    """A ledger and the pods it was handed, after ``steps`` random creations, changes and deletions."""
    rng = random.Random(seed)
    ledger, live = PodLedger(), {}
    for k in range(steps):
        if live and rng.random() < 0.3:
            name = rng.choice(list(live))
            del live[name]
            ledger.remove(name)
            continue
        name = rng.choice(list(live)) if live and rng.random() < 0.4 else f"p{k}"
        live[name] = random_pod(rng, name)
        ledger.put(name, live[name])
    return ledger, live


@pytest.mark.parametrize("seed", range(6))
def test_capacity_from_the_ledger_is_capacity_from_every_pod(seed):
    ledger, live = churned(seed)
    jobs = tuple(JobDemand(j, 1, 20, 3, Resources(2, 1)) for j in JOBS)
    scanned = Snapshot(NODES, tuple(live.values()), jobs)
    kept = Snapshot(NODES, ledger.pods(), jobs, totals=ledger.totals())
    assert sorted(p.name for p in kept.pods) == sorted(p.name for p in live.values() if not p.phase.terminated)
    for planned in (None, frozenset(), frozenset({"a"}), frozenset(JOBS)):
        out = []
        for snap in (scanned, kept):
            pending, bound, shapes, running = [], {}, set(), set()
            cap = capacity(snap, planned, pending, bound, shapes, running)
            out.append((cap, sorted(p.name for p in pending), {k: sorted(v) for k, v in bound.items()}, shapes, running))
        (a, *rest_a), (b, *rest_b) = out
        assert rest_a == rest_b
        assert a.names == b.names and a.total == b.total
        for x, y in ((a.free_cpu, b.free_cpu), (a.free_mem, b.free_mem), (a.free_gpu, b.free_gpu),
                     (list(a.requested.__dict__.values()), list(b.requested.__dict__.values()))):
            assert x == pytest.approx(y, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_the_plan_from_the_ledger_is_the_plan_from_every_pod(seed):
    ledger, live = churned(seed + 10, 1500)
    jobs = tuple(JobDemand(j, 1, 30, 2 + i, Resources(2, 1), priority=10 * (i % 2)) for i, j in enumerate(JOBS))
    policy = get_policy("edl")
    scanned = policy.plan(Snapshot(NODES, tuple(live.values()), jobs))
    kept = policy.plan(Snapshot(NODES, ledger.pods(), jobs, totals=ledger.totals()))
    assert kept.sizes == scanned.sizes and kept.nodes == scanned.nodes and kept.pods == scanned.pods


def test_totals_taken_earlier_do_not_change_with_the_ledger():
    ledger = PodLedger()
    ledger.put("t0", Pod("t0", Resources(2, 1), PodPhase.RUNNING, 0, "n0", "a", "trainer"))
    ledger.put("w0", Pod("w0", Resources(1, 1), PodPhase.PENDING, 0, None))
    ledger.put("s0", Pod("s0", Resources(0.1, 1), PodPhase.RUNNING, 0, "n0"))
    before = ledger.totals()
    ledger.put("t1", Pod("t1", Resources(2, 1), PodPhase.RUNNING, 0, "n1", "a", "trainer"))
    ledger.remove("w0")
    ledger.put("s0", Pod("s0", Resources(0.1, 1), PodPhase.SUCCEEDED, 0, "n0"))  # terminated: no longer counted
    assert [p.name for p in before.trainers["a"]] == ["t0"] and [p.name for p in before.waiting] == ["w0"]
    assert before.load == {"n0": (100, 2 ** 30, 0)}
    after = ledger.totals()
    assert [p.name for p in after.trainers["a"]] == ["t0", "t1"] and after.waiting == () and after.load == {}
    assert len(ledger) == 2 and after.requested == (0, 0, 0)
