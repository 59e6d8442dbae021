from __future__ import annotations

import numpy as np
import pytest

from edl.errors import UserError
from edl.sim.engine import Simulation
from edl.sim.scenario import load, parse

SMALL = {
    "name": "small", "duration_s": 120, "period_s": 5,
    "nodes": [{"count": 4, "cpu": 8, "memory_gi": 32}],
    "priorities": {"web": 100, "batch": 0},
    "services": [{"name": "web", "priority": "web", "pod": {"cpu": 2, "memory_gi": 1}, "startup_s": 1,
                  "replicas": [[0, 4], [40, 12], [80, 2]]}],
    "jobs": [{"name": "j", "count": 2, "submit_at": 5, "submit_every": 5, "priority": "batch",
              "fixed_pods": [{"role": "ps", "count": 1, "cpu": 1, "memory_gi": 1}],
              "trainer": {"cpu": 2, "memory_gi": 2}, "min": 1, "max": 8, "static": 4, "work": 4000,
              "throughput": {"per_trainer": 50, "efficiency": 0.9}, "rescale_cost_s": 2}],
}


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["jobs"][0]["trainer"].update(cpu=-1), "jobs[0].trainer.cpu"),
    (lambda d: d["jobs"][0].update(min=9), "jobs[0].min"),
    (lambda d: d["services"][0].update(priority="gold"), "services[0].priority"),
    (lambda d: d.pop("duration_s"), "duration_s"),
    (lambda d: d["services"][0].update(replicas=[[0, "x"]]), "services[0].replicas"),
    (lambda d: d.update(offpeak=[5, 1]), "offpeak"),
    (lambda d: d.update(scoring="random"), "scoring"),
])
def test_malformed_scenarios_name_the_field(mutate, field):
    import copy

    d = copy.deepcopy(SMALL)
    mutate(d)
    with pytest.raises(UserError, match=rf"scenario {__import__('re').escape(field)}"):
        parse(d)


def test_built_in_scenarios_load():
    c1, c2 = load("seed-case1"), load("seed-case2")
    assert len(c1.jobs) == 20 and len(c2.jobs) == 6
    assert abs(sum(g.count * g.allocatable.cpu for g in c1.nodes) - 2348) < 1
    with pytest.raises(UserError, match="no such file"):
        load("nope.yaml")


@pytest.mark.parametrize("policy", ["off", "edl2017", "edl"])
def test_simulation_invariants_and_report(policy):
    sim = Simulation(parse(SMALL), policy, check_invariants=True)  # asserts no over-commit every tick
    r = sim.run()
    assert r["policy"] == policy and 0 < r["utilization"]["mean"] <= 1
    assert {j["name"] for j in r["jobs"]} == {"j-00", "j-01"}
    assert all(j["jct_s"] is not None for j in r["jobs"])  # finite work finishes
    assert r["services"][0]["lag_s_max"] < 30  # web outranks training and preempts it
    assert np.all(sim.used <= sim.alloc + 1e-6)


def test_preemption_only_evicts_lower_priority():
    d = dict(SMALL)
    d["services"] = [dict(SMALL["services"][0], replicas=[[0, 16]]),
                     {"name": "low", "priority": 0, "pod": {"cpu": 2, "memory_gi": 1}, "replicas": [[10, 8]]}]
    d["jobs"] = [dict(SMALL["jobs"][0], count=1, submit_at=1000)]  # never submitted
    sim = Simulation(parse(d), "off")
    r = sim.run()
    # The 16 high-priority replicas fill the cluster; the low-priority service can never evict them.
    running = [p for p in sim.pods.values() if p.running]
    assert sum(1 for p in running if p.owner == "web") == 16
    assert not any(p.owner == "low" for p in running)
    assert r["services"][0]["lag_s_max"] < 5


def test_edl2017_reproduces_the_published_utilization_of_case2():
    r = Simulation(load("seed-case2"), "edl2017").run()
    assert abs(r["utilization"]["mean"] - 0.834) <= 0.05
    assert abs(r["utilization"]["offpeak_mean"] - 0.794) <= 0.05
    off = Simulation(load("seed-case2"), "off").run()
    assert abs(off["utilization"]["mean"] - 0.619) <= 0.05
    assert abs(off["utilization"]["offpeak_mean"] - 0.449) <= 0.05


def test_edl2017_case1_fast_run_matches_the_published_shape():
    on = Simulation(load("seed-case1"), "edl2017").run()
    off = Simulation(load("seed-case1"), "off").run()
    assert abs(on["utilization"]["mean"] - 0.763) <= 0.05
    # Pending time with autoscaling is an order of magnitude below without (published 47.2 s vs 308.5 s).
    assert on["pending_s_mean"] < off["pending_s_mean"] / 3
    # Early jobs hog, late jobs starve.
    assert on["fairness_jain"] < 0.8


def test_utilization_bound_counts_what_whole_pods_cannot_fill():
    from edl.sim.bound import utilization_bound

    d = {"name": "b", "duration_s": 10, "period_s": 5, "offpeak": [0, 4],
         "nodes": [{"count": 2, "cpu": 17.654, "memory_gi": 64}],
         "jobs": [{"name": "j", "count": 1, "submit_at": 5, "priority": 0, "trainer": {"cpu": 5, "memory_gi": 8},
                   "fixed_pods": [{"role": "ps", "count": 2, "cpu": 4, "memory_gi": 5}],
                   "min": 1, "max": 60, "static": 1, "throughput": {"per_trainer": 1, "efficiency": 1}}]}
    sc = parse(d)
    b = utilization_bound(sc, "edl")
    # Before t=5 nothing runs; then at most three 5-core trainers fit a 17.654-core node:
    # 2 x 15 = 30 cores (the bound only maximises what runs, so it may leave the ps out).
    assert b["offpeak_mean"] == 0.0
    assert abs(b["mean"] - 0.5 * 30 / (2 * 17.654)) < 1e-9
    # Under `off` the job asks for one trainer: 5 + 4 + 4 = 13 cores.
    assert abs(utilization_bound(sc, "off")["mean"] - 0.5 * 13 / (2 * 17.654)) < 1e-9


def test_seed_case2_targets_exceed_what_any_policy_can_pack():
    from edl.sim.bound import utilization_bound

    b = utilization_bound(load("seed-case2"), "edl")
    assert 0.9 < b["mean"] < 0.92 and 0.9 < b["offpeak_mean"] < 0.92


def test_a_shrink_deletes_the_trainers_on_nodes_the_plan_no_longer_keeps():
    """As edl's launcher does (``edl.api.policy.leaving``), not the youngest as a ReplicaSet would."""
    import copy

    d = copy.deepcopy(SMALL)
    d["services"] = []
    d["jobs"][0].update(count=1, submit_at=0, fixed_pods=[], static=4)
    sim = Simulation(parse(d), "off")
    for k in range(10):
        sim.tick(k, 5)
    trainers = sorted(sim._owned("j", "trainer"), key=lambda p: p.created)
    assert len(trainers) == 4 and all(p.running for p in trainers)
    oldest, *rest = trainers
    js = sim.jobs["j"]
    js.target, js.hints = 3, tuple(sorted(sim.node_names[p.node] for p in rest))
    assert sim.node_names[oldest.node] not in js.hints  # the default profile spread them: one per node
    sim._controllers(sim.now)
    assert [p.id for p in trainers if p.id not in {q.id for q in sim._owned("j", "trainer")}] == [oldest.id]


@pytest.mark.parametrize("policy, where", [("edl", 1), ("edl2017", 0)])
def test_a_jobs_fixed_pods_go_where_the_plan_puts_them(policy, where):
    """As the launcher asks the plan where the pods it creates go: a 4-core pserver on an empty
    12.654-core node leaves two more pservers' room, as on the 17.654-core one, and it is the tighter
    of the two; the default profile (LeastAllocated) alone spreads it onto the larger node."""
    d = {"name": "f", "duration_s": 10, "period_s": 5,
         "nodes": [{"count": 1, "cpu": 17.654, "memory_gi": 64}, {"count": 1, "cpu": 12.654, "memory_gi": 64}],
         "jobs": [{"name": "j", "count": 1, "submit_at": 1, "priority": 0, "trainer": {"cpu": 5, "memory_gi": 8},
                   "fixed_pods": [{"role": "ps", "count": 1, "cpu": 4, "memory_gi": 5}],
                   "min": 1, "max": 2, "static": 1, "throughput": {"per_trainer": 1, "efficiency": 1}}]}
    sim = Simulation(parse(d), policy)
    for k in range(3):
        sim.tick(k, 5)
    (ps,) = sim._owned("j", "ps")
    assert ps.node == where and ps.hint == (1 if policy == "edl" else None)


def test_placed_bound_packs_the_movable_pods_into_what_the_kept_ones_leave():
    from edl.api.cluster import Resources
    from edl.sim.bound import placed_bound
    from edl.sim.engine import PlacedInstant

    # Two 17.654-core nodes, each holding three 3-core service pods where the scheduler put them:
    # 8.654 cores free on each. Two 4-core pservers fill one (8), one 5-core trainer the other (5);
    # two trainers would give 10 only.
    free = ((Resources(8.654, 55.0), 2),)
    movable = ((Resources(4, 5), 2), (Resources(5, 8), 4))
    b = placed_bound([PlacedInstant(0.0, 18.0, free, movable), PlacedInstant(5.0, 18.0, free, ())],
                     2 * 17.654, offpeak=(4, 6))
    assert abs(b["mean"] - ((18 + 13) + 18) / 2 / (2 * 17.654)) < 1e-9
    assert abs(b["offpeak_mean"] - 18 / (2 * 17.654)) < 1e-9


@pytest.mark.parametrize("policy", ["off", "edl2017", "edl"])
def test_every_instant_is_below_the_packing_around_what_ran(policy):
    """At every tick: utilization <= the best packing of the trainers around the services and fixed
    pods as they are <= the best packing of every job pod around the services as they are."""
    from edl.sim.bound import placed_bound

    sim = Simulation(parse(SMALL), policy, record_placement=True)
    sim.run()
    assert len(sim.placed) == len(sim.timeline)
    for x, (trainers, job_pods) in zip(sim.timeline, sim.placed):
        a = placed_bound([trainers], sim.total_cpu)["mean"]
        b = placed_bound([job_pods], sim.total_cpu)["mean"]
        assert x["util"] <= a + 1e-9 <= b + 2e-9
    # While the web service holds 12 of the 16 two-core slots, both jobs together still fit.
    assert any(placed_bound([t], sim.total_cpu)["mean"] > x["util"] for x, (t, _) in zip(sim.timeline, sim.placed))


def test_seed_case2_is_out_of_reach_while_the_services_stay_where_they_ran():
    """What a policy that cannot move Nginx's pods could reach in edl's own run of case 2: with the
    pservers where they ran too (all that placing trainers can use) about 84 %, with the pservers packed
    about 88 %: both below the 90 % target, which needs Nginx packed too (the 92 % bound)."""
    from edl.sim.report import simulate

    r, _ = simulate(load("seed-case2"), "edl", runs=1)
    u = r["utilization"]
    assert u["mean"] <= u["trainers_bound_mean"] <= u["job_pods_bound_mean"] < 0.9 < u["bound_mean"]
    assert 0.83 < u["trainers_bound_mean"] < 0.86 and u["trainers_bound_offpeak_mean"] < 0.82
    assert u["job_pods_bound_offpeak_mean"] < 0.89


@pytest.mark.parametrize("policy", ["edl2017", "edl"])
def test_skipping_decisions_that_cannot_differ_changes_nothing(policy):
    """The engine reuses the last plan when nothing the policy reads has changed (pods, jobs,
    targets; remaining work only through the completion order): the runs must be identical."""
    for scenario in (parse(SMALL), load("seed-case2")):
        fast, full = Simulation(scenario, policy), Simulation(scenario, policy, reuse_plans=False)
        a, b = fast.run(), full.run()
        a.pop("wall_s"), b.pop("wall_s")
        assert a == b
        assert fast.decisions < full.decisions


def test_a_job_start_is_not_a_rescale():
    """As edl's master does, the first generation forms once every trainer asked for runs
    (start-up jitter spreads them over ticks), or after the start grace with what runs."""
    import copy

    d = copy.deepcopy(SMALL)
    d["services"] = []
    d["jobs"][0].update(count=1, startup_s=5, static=6)  # 6 trainers start 4-6 s after binding
    sim = Simulation(parse(d), "off", seed=3)
    r = sim.run()
    js = sim.jobs["j"]
    assert r["rescale_events"] == 0
    assert js.formed_at is not None and js.formed_at > js.started_at  # waited for the stragglers
    # No work was done before the generation formed: the job needs its whole run after it.
    assert js.completed_at - js.formed_at >= 4000 / js.curve[6] - 1


def test_a_job_whose_trainers_cannot_all_run_starts_after_the_grace():
    import copy

    from edl.sim.engine import START_GRACE_S

    d = copy.deepcopy(SMALL)
    d["services"] = []
    d["nodes"] = [{"count": 1, "cpu": 8, "memory_gi": 32}]
    d["jobs"][0].update(count=1, static=6, work=100000)  # room for 3 trainers next to the ps
    sim = Simulation(parse(d), "off", seed=0)
    sim.run()
    js = sim.jobs["j"]
    assert js.formed_at - js.started_at == pytest.approx(START_GRACE_S, abs=1)
    assert js.last_running == 3


def test_edl_cuts_mean_completion_time_on_mixed_work():
    """The issue's completion-time target, on jobs of three sizes arriving over time (virtual time)."""
    from pathlib import Path

    sc = load(str(Path(__file__).parents[3] / "bench" / "scenarios" / "mixed-work.yaml"))
    jct = {p: Simulation(sc, p, seed=0, check_invariants=False).run()["jct_s_mean"] for p in ("off", "edl2017", "edl")}
    assert jct["edl"] <= 0.70 * jct["off"]
    assert jct["edl"] <= 0.90 * jct["edl2017"]


def test_a_job_is_pending_until_a_trainer_of_it_runs_not_its_fixed_pods():
    # Under off, job j-01's parameter server fits beside j-00 at once, its static trainers only when
    # j-00 is done: it waits all that time to train, and its pending time says so.
    import copy

    d = copy.deepcopy(SMALL)
    d["services"] = []
    d["nodes"] = [{"count": 1, "cpu": 10, "memory_gi": 32}]
    d["jobs"][0].update(static=4, work=20000)
    d["duration_s"] = 600
    r = Simulation(parse(d), "off").run()
    first, second = r["jobs"]
    assert first["jct_s"] > 60 and first["pending_s"] < 15
    assert second["pending_s"] > first["jct_s"] / 2  # its parameter server ran from the start
