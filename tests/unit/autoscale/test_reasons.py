"""Why a job is at its size: each policy's reason for each cause, and how the sidecar carries it."""

from __future__ import annotations

import dataclasses

import pytest

from edl.api.cluster import JobDemand, Pod, PodPhase, Resources, SizeCause, SizeReason, Snapshot
from edl.autoscale.policy import get_policy
from edl.autoscale.reasons import owner
from edl.cluster.demand_lease import REASON_ANNOTATION, demand_lease

from .test_sidecar import MemoryMaster, MemoryView, nodes, sidecar

TR = Resources(2, 4, 0)


def job(current: int, lo: int = 1, hi: int = 8, **kw) -> JobDemand:
    return JobDemand("ns/a", lo, hi, current, TR, **kw)


def trainers(n: int, node: str = "n0") -> list[Pod]:
    return [Pod(f"ns/a-t{i}", TR, PodPhase.RUNNING, 0, node, "ns/a", "trainer") for i in range(n)]


def explain(policy: str, snap: Snapshot) -> SizeReason:
    p = get_policy(policy)
    return p.explain(snap, p.plan(snap), "ns/a")


@pytest.mark.parametrize("policy", ["edl", "edl2017"])
def test_a_job_at_its_maximum_says_so(policy):
    snap = Snapshot(tuple(nodes(2)), tuple(trainers(2)), (job(2, hi=2),))
    r = explain(policy, snap)
    assert r.cause is SizeCause.AT_MAX and r.text == "at its maximum of 2 trainers"


@pytest.mark.parametrize("policy", ["edl", "edl2017"])
def test_a_job_on_full_nodes_names_who_holds_them(policy):
    web = [Pod(f"web-7d9f8-{c}x2k9", Resources(2, 4, 0), PodPhase.RUNNING, 0, "n0") for c in "abc"]
    snap = Snapshot(tuple(nodes(1)), (*trainers(1), *web), (job(1),))
    r = explain(policy, snap)
    assert r.cause is SizeCause.NO_ROOM, r
    if policy == "edl":
        assert r.text == "no room for another trainer (2 CPU); the nodes it may run on hold web (3 pods, 6 CPU)"


def test_a_job_shrunk_for_higher_priority_pods_names_them():
    web = [Pod("web-0", Resources(8, 8, 0), PodPhase.PENDING, priority=1000)]
    snap = Snapshot(tuple(nodes(2)), (*trainers(4, "n0"), *trainers(4, "n1"), *web), (job(8),))
    r = explain("edl", snap)
    assert r.cause is SizeCause.HANDED_BACK
    assert r.text == "handed 4 trainer(s) back to pods of a higher priority: web-0 (1 pod, 8 CPU)"


def test_growth_that_does_not_pay_for_its_pause_gives_the_numbers():
    # 100 rows/s with 1, 2 more per trainer; a 10 s pause; 1,000 rows left: 10 s of work, 20 rows gained < 1,000 lost.
    j = job(1, throughput=(0.0, 100.0, 102.0, 104.0, 106.0, 108.0, 110.0, 112.0, 114.0), rescale_cost_s=10.0,
            remaining=1000.0)
    snap = Snapshot(tuple(nodes(2)), tuple(trainers(1)), (j,))
    r = explain("edl", snap)
    assert r.cause is SizeCause.NOT_WORTH_PAUSE
    assert r.text == ("growth 1 -> 2 not worth its pause: +2 rows/s (100 -> 102) over the 10 s that count "
                      "against 1000 rows lost in a 10.0 s pause")


def test_a_job_whose_minimum_does_not_fit_waits():
    web = [Pod("db-0", Resources(7, 8, 0), PodPhase.RUNNING, 0, "n0")]
    snap = Snapshot(tuple(nodes(1)), tuple(web), (job(0, lo=2),))
    r = explain("edl", snap)
    assert r.cause is SizeCause.WAITING
    assert r.text == "waiting for room for its minimum of 2 trainers; the nodes hold db-0 (1 pod, 7 CPU)"


def test_a_job_growing_into_free_room():
    snap = Snapshot(tuple(nodes(2)), tuple(trainers(1)), (job(1),))
    r = explain("edl", snap)
    assert r.cause is SizeCause.GROWING and r.text == "growing 1 -> 8 (its maximum): there is room for it"


def test_owners_are_named_without_generated_suffixes():
    def pod(name: str, job: str | None = None) -> Pod:
        return Pod(name, TR, PodPhase.RUNNING, job=job)

    assert owner(pod("web-7d9f8c6b5-x2k9q")) == "web"
    assert owner(pod("etl-worker-0")) == "etl-worker-0"
    assert owner(pod("ns/b-t3", "ns/b")) == "ns/b"


# ------------------------------------------------------------ the sidecar carries it
def test_the_sidecar_sends_the_reason_with_the_size_and_puts_it_on_its_lease():
    web = [Pod("web-0", Resources(8, 8, 0), PodPhase.PENDING, priority=1000)]
    view = MemoryView(nodes(2), web, {})
    master = MemoryMaster(8)
    s = sidecar("ns/a", view, master)
    assert s.step() == 4
    assert master.reason.cause is SizeCause.HANDED_BACK and "web-0" in master.reason.text
    assert view.reason == master.reason  # published after the decision: the Lease carries this one
    lease = demand_lease(job(4), "edl-a-demand", "ns", "pod-x", 1_000_000.0, 30, {}, master.reason)
    assert lease["metadata"]["annotations"][REASON_ANNOTATION].startswith('{"cause":"handed_back","text":')


def test_a_new_reason_alone_is_sent_and_the_same_one_is_not_sent_again():
    master = MemoryMaster(8)
    view = MemoryView(nodes(4), [], {})
    s = sidecar("ns/a", view, master)
    sent = []
    scale = master.scale
    master.scale = lambda n, nodes=(), reason=None, released=None: (sent.append(reason), scale(n, nodes, reason))
    assert s.step() is None and [r.cause for r in sent] == [SizeCause.AT_MAX]
    assert s.step() is None and len(sent) == 1  # unchanged: no call


def test_the_reasons_of_holding():
    master = MemoryMaster(3)
    s = sidecar("ns/a", MemoryView(nodes(4), [], {}, healthy=False), master)
    assert s.step() is None and master.calls == [] and master.desired == 3
    assert master.reason.cause is SizeCause.HELD_API_AWAY and master.reason.text.startswith("held at 3:")
    held = MemoryMaster(1)
    base = held.status
    held.status = lambda: dataclasses.replace(base(), unschedulable_at=995.0)
    s = sidecar("ns/a", MemoryView(nodes(4), [], {}), held, clock=lambda: 1000.0)
    assert s.step() is None and held.calls == []
    assert held.reason.cause is SizeCause.HELD_UNSCHEDULABLE
    assert held.reason.text.startswith("held at 1 for 60 s more: trainers could not be scheduled lately")


def test_size_reason_json_round_trip():
    r = SizeReason(SizeCause.NO_ROOM, "no room")
    assert SizeReason.from_json(r.to_json()) == r and r.to_json() == {"cause": "no_room", "text": "no room"}
