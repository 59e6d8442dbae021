"""The sidecar's decision step over in-memory parts: agreement, bounds, holding, the Lease codec."""

from __future__ import annotations

from dataclasses import replace

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edl.api.cluster import JobDemand, Node, PlanLine, Pod, PodPhase, Resources, SizeCause, SizeReason
from edl.api.master import GenerationSummary, JobStatus, JobView, Phase, Reason, Source
from edl.autoscale.policy import get_policy
from edl.api.cluster import decode_demand, encode_demand
from edl.autoscale.sidecar import Sidecar, SidecarConfig, ThroughputMeter, job_offset, rescale_cost_s
from edl.cluster.demand_lease import demand_from_lease, demand_lease

TR = Resources(2, 4, 0)


class MemoryView:
    """In-memory ClusterView: nodes, pods and a shared board of demands."""

    def __init__(self, nodes, pods, board: dict, healthy: bool = True) -> None:
        self._nodes, self._pods, self.board, self.ok = nodes, pods, board, healthy

    def healthy(self):
        return self.ok

    def nodes(self):
        return list(self._nodes)

    def pods(self):
        return list(self._pods)

    def totals(self):
        return None  # the policy adds the pods up

    def peer_demands(self, now):
        return [d for d, at in self.board.values() if now - at < 30]

    def publish(self, demand, now, reason=None):
        self.board[demand.name] = (demand, now)
        self.reason = reason

    def refresh(self, now):
        pass

    def lead(self, now):
        return True

    def publish_plan(self, lines, now):
        self.lines = lines
        return True

    def plan_line(self, job, now):
        return None


def job_view(status: JobStatus, desired: int, generations=()) -> JobView:
    return JobView(job="a", status=status, error=None, master_uid="1", phase=Phase.RUNNING, generation=1,
                   world_size=desired, desired_trainers=desired, unschedulable_at=None, min_trainers=1,
                   max_trainers=8, epoch=0, epochs=1, epochs_completed=0, rows_per_epoch=0, done_rows=(0,), step=0,
                   loss=None, trainers=(), generations=tuple(generations), checkpoints=(), elapsed_s=0.0)


class MemoryMaster:
    def __init__(self, desired: int, status: JobStatus = JobStatus.RUNNING) -> None:
        self.desired, self.st, self.calls, self.hints, self.reason = desired, status, [], (), None

    def status(self):
        return replace(job_view(self.st, self.desired), node_hints=self.hints, reason=self.reason)

    def scale(self, n, nodes=(), reason=None, released=None):
        if n != self.desired:
            self.calls.append(n)  # size changes; a new placement or reason alone is in ``hints``, ``reason``
        self.desired, self.hints, self.reason = n, tuple(nodes), reason


def nodes(n, cpu=8.0):
    return [Node(f"n{i}", Resources(cpu, 64, 0)) for i in range(n)]


def sidecar(job, view, master, lo=1, hi=8, clock=lambda: 1000.0):
    return Sidecar(SidecarConfig(job, TR, lo, hi, 10, 2), view, master, get_policy("edl"), clock)


def test_sidecars_of_two_jobs_agree_and_share_the_cluster():
    board: dict = {}
    view = MemoryView(nodes(2), [], board)
    a, b = MemoryMaster(1), MemoryMaster(1)
    sa, sb = sidecar("ns/a", view, a), sidecar("ns/b", view, b)
    for _ in range(3):  # a few rounds: each publishes, reads the other, applies its own line
        sa.step()
        sb.step()
    assert a.desired + b.desired == 8  # 16 cores / 2 per trainer, shared
    # a came first and keeps part of its lead: a held trainer counts 1.5x one to be gained.
    assert (a.desired, b.desired) == (5, 3)


def test_higher_priority_pending_pod_takes_capacity_back_in_one_step():
    board: dict = {}
    web = [Pod("web-0", Resources(8, 8, 0), PodPhase.PENDING, priority=1000)]
    master = MemoryMaster(8)
    s = sidecar("ns/a", MemoryView(nodes(2), web, board), master)
    assert s.step() == 4 and master.calls == [4]


def test_holds_the_size_while_the_cluster_view_is_not_current():
    master = MemoryMaster(3)
    s = sidecar("ns/a", MemoryView(nodes(4), [], {}, healthy=False), master)
    assert s.step() is None and master.calls == [] and s.holding
    # and does nothing for a job that is over or a master that is away
    assert sidecar("ns/a", MemoryView(nodes(4), [], {}), MemoryMaster(3, JobStatus.SUCCEEDED)).step() is None


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(0, 4), st.integers(1, 10), st.integers(0, 10))
def test_never_outside_min_and_max(lo, extra, n_nodes, current):
    hi = lo + extra
    master = MemoryMaster(max(lo, min(hi, current)))
    s = sidecar("ns/a", MemoryView(nodes(n_nodes, cpu=4), [], {}), master, lo, hi)
    s.step()
    assert lo <= master.desired <= hi


def test_demand_lease_round_trip_and_expiry():
    d = JobDemand("ns/a", 1, 8, 3, TR, 5, (0.0, 100.0, 190.5), 0.8, 1234.0)
    assert decode_demand(encode_demand(d)) == d
    lease = demand_lease(d, "edl-a-demand", "ns", "pod-x", now=1_000_000.0, duration_s=30, labels={})
    assert lease["kind"] == "Lease" and lease["spec"]["leaseDurationSeconds"] == 30
    assert demand_from_lease(lease, 1_000_010.0) == d
    assert demand_from_lease(lease, 1_000_031.0) is None  # its sidecar stopped renewing
    lease["metadata"]["annotations"]["edl.dev/demand"] = '{"name": "x"}'
    assert demand_from_lease(lease, 1_000_010.0) is None  # malformed: ignored, not fatal
    with pytest.raises(ValueError):
        decode_demand('{"name":"a","min":5,"max":2,"current":1,"trainer":{"cpu":1,"memory":1,"gpu":0}}')


def test_throughput_meter_measures_per_world_size():
    m = ThroughputMeter(alpha=1.0)
    m.observe(0, 0, 2, 1)
    m.observe(10, 500, 2, 1)  # generation 1's first interval: its start and warm-up, left out
    m.observe(20, 2500, 2, 1)  # 200/s with 2
    m.observe(30, 3000, 4, 2)  # the size changed in between: no figure
    m.observe(40, 4000, 4, 2)  # generation 2's first interval: left out
    m.observe(50, 7600, 4, 2)  # 360/s with 4
    assert m.by_world == {2: 200.0, 4: 360.0}
    assert m.curve() == (0.0, 100.0, 200.0, 280.0, 360.0)
    m.observe(60, 8000, 4, 3)  # a new generation of the same size (a trainer replaced): no figure
    m.observe(70, 8100, 4, 3)  # its first interval: left out
    assert m.by_world[4] == 360.0
    m.forget_above(2)  # the job was shrunk to 2: the figure of 4 it can no longer correct goes
    assert m.by_world == {2: 200.0}


def test_rescale_cost_is_the_median_measured_pause():
    def gen(reason: Reason, pause_s: float | None) -> GenerationSummary:
        return GenerationSummary(1, 1, 1, ("t",), reason, Source.PEER, 0, pause_s, 0.0, None, 0)

    gens = [gen(Reason.START, 5.0), gen(Reason.SCALE_UP, 0.5), gen(Reason.SCALE_DOWN, 0.3),
            gen(Reason.FAILURE, 0.9), gen(Reason.RESUME, None)]
    assert rescale_cost_s(job_view(JobStatus.RUNNING, 1, gens)) == 0.5


def test_job_offsets_are_fixed_and_spread():
    offs = [job_offset(f"ns/job-{i}", 2.0) for i in range(50)]
    assert all(0 <= o < 2.0 for o in offs) and len(set(offs)) == 50
    assert job_offset("ns/job-1", 2.0) == offs[1]


def test_no_growth_for_a_while_after_trainers_were_unschedulable():
    master = MemoryMaster(1)
    base = master.status

    master.status = lambda: dataclasses.replace(base(), unschedulable_at=995.0)
    s = sidecar("ns/a", MemoryView(nodes(4), [], {}), master, clock=lambda: 1000.0)
    assert s.step() is None and master.calls == []
    s.clock = lambda: 1000.0 + 10 * 6  # the back-off (6 periods of 10 s) is over
    assert s.step() == 8


def test_the_back_off_after_unschedulable_trainers_runs_on_the_sidecars_clock():
    # The master times its report on its own monotonic clock: 5.0 means nothing to a sidecar on wall time.
    master = MemoryMaster(1)
    base = master.status
    master.status = lambda: dataclasses.replace(base(), unschedulable_at=5.0)
    s = sidecar("ns/a", MemoryView(nodes(4), [], {}), master, clock=lambda: 1_800_000_000.0)
    assert s.step() is None and master.calls == []  # first seen now: no growth for six periods
    s.clock = lambda: 1_800_000_000.0 + 10 * 5
    assert s.step() is None and master.calls == []
    s.clock = lambda: 1_800_000_000.0 + 10 * 6
    assert s.step() == 8


def test_the_plan_s_nodes_go_to_the_master_with_the_size_and_again_only_when_they_change():
    # One 2-core trainer held on n0; a 6-core service pod bound to n1.
    pods = [Pod("ns/a-t1", TR, PodPhase.RUNNING, 0, "n0", "ns/a", "trainer"),
            Pod("web-0", Resources(6, 4, 0), PodPhase.RUNNING, 1000, "n1")]
    view = MemoryView(nodes(2), pods, {})
    master = MemoryMaster(1)
    s = sidecar("ns/a", view, master)
    assert s.step() == 5 and master.calls == [5]
    # n1 keeps 2 cores beside the service: best fit fills it first, then n0 around the held trainer.
    assert master.hints == ("n0", "n0", "n0", "n0", "n1")
    before = list(master.calls)
    master.hints = ()  # a restarted master knows no nodes: the sidecar sends them again, size unchanged
    assert s.step() is None and master.calls == before and len(master.hints) == 5


def test_a_job_shrunk_for_higher_priority_work_grows_back_when_the_work_leaves():
    # Its figure at 2 trainers was measured low (a busier cluster, a preemption's last seconds): dropped with
    # the shrink, so that the job grows back when the capacity returns instead of keeping a figure it can
    # never correct at 1 trainer.
    master = MemoryMaster(2)
    base = master.status
    paused = GenerationSummary(2, 2, 1, ("t",), Reason.SCALE_UP, Source.PEER, 0, 0.3, 0.0, None, 0)
    # 35,000 rows left (15 s at 1 trainer), changes measured at 0.3 s: growth must pay for its pause.
    master.status = lambda: replace(base(), rows_per_epoch=1000, epochs=40, done_rows=(5000,), generations=(paused,))
    view = MemoryView(nodes(1), [Pod("web-0", Resources(6, 8, 0), PodPhase.RUNNING, 1000, "n0")], {})
    s = sidecar("ns/a", view, master, hi=2)
    s.meter.by_world = {1: 2300.0, 2: 2162.0}
    assert s.step() == 1  # one 2-core trainer fits beside the service
    view._pods = []  # the service is gone
    assert s.step() == 2 and master.calls == [1, 2]


class HoldingMaster(MemoryMaster):
    """A master holding the replacements of trainers told to stop until a decision releases them."""

    def __init__(self, desired: int, held: tuple[str, ...]) -> None:
        super().__init__(desired)
        self.held, self.said, self.released = held, 0, []

    def status(self):
        return replace(super().status(), held_replacements=self.held)

    def scale(self, n, nodes=(), reason=None, released=None):
        self.said += 1
        self.released.append(released)
        self.held = tuple(t for t in self.held if released is not None and t not in released)
        super().scale(n, nodes, reason)


def test_an_unchanged_size_is_said_again_while_replacements_wait_for_the_decision():
    master = HoldingMaster(2, held=())
    s = sidecar("ns/a", MemoryView(nodes(1, cpu=4.0), [], {}), master, hi=2)
    s.step()  # sizes the job: 2 trainers fit, the plan's nodes and reason said
    said = master.said
    assert s.step() is None and master.said == said  # nothing new: nothing said
    master.held = ("ns-a-t1",)  # a trainer was told to stop (deleted, say): the room is still there
    assert s.step() is None and master.said == said + 1 and master.calls == []
    assert master.released[-1] == ("ns-a-t1",) and master.held == ()  # released what it saw, no more


class ElectedView(MemoryView):
    """Two sidecars' views of one namespace: ``leads`` decides, and its lines are what the other reads."""

    def __init__(self, *a, leads: bool, lines: dict, **kw) -> None:
        super().__init__(*a, **kw)
        self.leads, self.shared = leads, lines

    def lead(self, now):
        return self.leads

    def publish_plan(self, lines, now):
        self.shared.clear()
        self.shared.update(lines)
        return True

    def plan_line(self, job, now):
        return self.shared.get(job)

    def pods(self):
        assert self.leads, "a follower reads no pods"
        return super().pods()


def test_the_deciding_sidecar_plans_every_job_and_the_other_follows_its_line():
    board, lines = {}, {}
    # b's trainers run at a higher priority than b's Lease says: the decider reads it from the pods.
    b_trainer = Pod("ns/b-t0", TR, PodPhase.RUNNING, 100, "n0", "ns/b", "trainer")
    lead = ElectedView(nodes(2), [b_trainer], board, leads=True, lines=lines)
    follow = ElectedView(nodes(2), [], board, leads=False, lines=lines)
    a, b = MemoryMaster(1), MemoryMaster(1)
    sa, sb = sidecar("ns/a", lead, a), sidecar("ns/b", follow, b)
    sb.step()  # nothing planned yet: b holds, and says why
    assert b.calls == [] and b.reason.cause is SizeCause.HELD_NO_PLAN and b.reason.text.startswith("held at 1:")
    for _ in range(3):
        sa.step()
        sb.step()
    assert set(lines) == {"ns/a", "ns/b"} and sb.decisions == 0  # only the decider plans
    # b's higher priority weighs twice: it gets the larger share (at one priority, a would keep its lead: 5, 3).
    assert (a.desired, b.desired) == (3, 5) == (lines["ns/a"].size, lines["ns/b"].size)
    assert b.reason == lines["ns/b"].reason and b.hints == lines["ns/b"].nodes
    assert board["ns/b"][0].priority == 0  # what b itself published: it reads no pods


def test_a_follower_still_backs_off_after_unschedulable_trainers():
    lines = {"ns/a": PlanLine(6, (), SizeReason(SizeCause.GROWING, "growing 2 -> 6: there is room for it"))}
    master = MemoryMaster(2)
    master.status = lambda: replace(job_view(JobStatus.RUNNING, 2), unschedulable_at=990.0)
    s = sidecar("ns/a", ElectedView(nodes(2), [], {}, leads=False, lines=lines), master)
    s.step()
    assert master.desired == 2 and master.reason.cause is SizeCause.HELD_UNSCHEDULABLE


def test_a_follower_releases_held_replacements_only_to_a_plan_made_after_it_saw_them():
    reason = SizeReason(SizeCause.AT_MAX, "at its maximum of 2 trainers")
    lines: dict = {}
    clock = [1000.0]
    master = HoldingMaster(2, held=("ns-a-t1",))
    s = sidecar("ns/a", ElectedView(nodes(1), [], {}, leads=False, lines=lines), master, hi=2, clock=lambda: clock[0])
    s.step()  # no plan yet: held, and nothing released
    assert master.reason.cause is SizeCause.HELD_NO_PLAN and master.released[-1] == () and master.held == ("ns-a-t1",)
    lines["ns/a"] = PlanLine(2, (), reason, 995.0)  # planned before this sidecar saw the trainer held
    clock[0] = 1010.0
    s.step()
    assert master.released[-1] == () and master.held == ("ns-a-t1",)
    lines["ns/a"] = PlanLine(2, (), reason, 1005.0)  # planned after: it releases it
    clock[0] = 1020.0
    s.step()
    assert master.released[-1] == ("ns-a-t1",) and master.held == ()
