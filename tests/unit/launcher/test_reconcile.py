"""The launcher's trainer decisions, as a pure function."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edl.api.cluster import PodPhase
from edl.api.cluster import TrainerExit, TrainerPod
from edl.launcher.reconcile import plan_trainers

R, P, S, F = PodPhase.RUNNING, PodPhase.PENDING, PodPhase.SUCCEEDED, PodPhase.FAILED


def pod(name, phase=R, created=0.0, node="n", exit=None, message=""):
    return TrainerPod(name, phase, created, None if phase is P else node, exit, message)


def test_scale_up_creates_the_missing_trainers():
    assert plan_trainers(3, [pod("a")], {}, 10, 60).create == 2


def test_scale_down_drains_the_youngest_running_and_deletes_pending_first():
    pods = [pod("old", created=1), pod("young", created=5), pod("waiting", P, created=6)]
    plan = plan_trainers(1, pods, {}, 10, 60)
    assert plan.delete == ("waiting",) and plan.drain == ("young",) and plan.create == 0


def test_among_trainers_first_seen_at_once_the_highest_numbered_is_the_youngest():
    # An adopted job's trainers are all first seen on the new launcher's first round: j-t12 is younger than
    # j-t9 (which sorts after it as a string).
    p = plan_trainers(2, [pod("j-t9"), pod("j-t12"), pod("j-t10")], {}, now=1.0, pending_timeout_s=60)
    assert p.drain == ("j-t12",)


def test_scale_down_drains_the_trainers_on_nodes_the_plan_no_longer_keeps():
    # The plan keeps n0 and n1: the old trainer on n2 goes, not the youngest (on n1).
    pods = [pod("old", created=1, node="n2"), pod("mid", created=3, node="n0"), pod("young", created=5, node="n1")]
    plan = plan_trainers(2, pods, {}, 10, 60, node_hints=("n0", "n1"))
    assert plan.drain == ("old",) and plan.delete == ()
    # A node that keeps one of two trainers there lets the younger of them go.
    pods = [pod("a", created=1, node="n0"), pod("b", created=2, node="n0"), pod("c", created=3, node="n1")]
    assert plan_trainers(2, pods, {}, 10, 60, node_hints=("n0", "n1")).drain == ("b",)
    # Without a plan (``edl scale N``), the youngest as before.
    assert plan_trainers(2, pods, {}, 10, 60).drain == ("c",)


def test_drained_trainers_are_not_counted_and_removed_after_a_timeout():
    pods = [pod("a"), pod("b", created=3)]
    plan = plan_trainers(1, pods, {"b": 0.0}, 10, 60)
    assert plan == plan_trainers(1, pods, {"b": 0.0}, 10, 60) and not plan.drain and not plan.create
    assert plan_trainers(1, pods, {"b": 0.0}, 100, 60, drain_timeout_s=60).delete == ("b",)
    # A drained trainer that exits non-zero is not a failure.
    done = plan_trainers(1, [pod("a"), pod("b", F, exit=TrainerExit.FAILED)], {"b": 0.0}, 10, 60)
    assert done.delete == ("b",) and not done.failures and done.exited == (("b", 1),)


def test_preempted_and_node_lost_trainers_are_replaced_without_counting_a_failure():
    pods = [pod("a"), pod("b", F, exit=TrainerExit.PREEMPTED), pod("c", F, exit=TrainerExit.NODE_LOST)]
    plan = plan_trainers(3, pods, {}, 10, 60)
    assert plan.relaunched == ("b", "c") and not plan.failures and plan.create == 2
    assert set(plan.delete) == {"b", "c"}


def test_oom_killed_fails_the_job_and_other_crashes_count():
    plan = plan_trainers(2, [pod("a", F, exit=TrainerExit.OOM_KILLED, message="limit 4Gi"),
                             pod("b", F, exit=TrainerExit.FAILED, message="exit 1")], {}, 10, 60)
    assert plan.fatal == (TrainerExit.OOM_KILLED, "limit 4Gi")
    assert plan.failures == (("b", "exit 1"),)


def test_pending_too_long_is_unschedulable_removed_and_not_replaced():
    pods = [pod("a"), pod("stuck", P, created=0.0), pod("fresh", P, created=95.0)]
    plan = plan_trainers(3, pods, {}, 100, 60)
    assert plan.unschedulable == ("stuck",) and "stuck" in plan.delete and plan.create == 0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 6), st.lists(st.tuples(st.sampled_from([R, P, S, F]), st.sampled_from(list(TrainerExit)),
                                             st.floats(0, 100), st.booleans()), max_size=8))
def test_after_the_plan_the_live_count_meets_the_desired_count(desired, specs):
    pods, draining = [], {}
    for i, (phase, ex, created, drained) in enumerate(specs):
        pods.append(pod(f"t{i}", phase, created, exit=ex if phase.terminated else None))
        if drained:
            draining[f"t{i}"] = 50.0
    plan = plan_trainers(desired, pods, draining, 100.0, 60.0)
    removed = set(plan.delete) | set(plan.drain)
    live = [p for p in pods if not p.phase.terminated and p.name not in draining and p.name not in removed]
    left_unasked = any(p.phase.terminated and p.exit is TrainerExit.SUCCEEDED and p.name not in draining
                       for p in pods)
    if left_unasked:
        assert plan.create == 0  # the job may be ending: the next round, with a fresh status, decides
    else:
        assert len(live) + plan.create + len(plan.unschedulable) >= desired  # unschedulable ones are reported
    done = plan_trainers(desired, pods, draining, 100.0, 60.0, data_done=True)
    assert done.create <= 1 and (done.create == 0 if live or left_unasked else True)  # one, to finish
    assert len(live) + plan.create <= max(desired, len(live))
    for p in pods:
        if p.name in plan.delete:  # only what ended, what never got placed, or drains that overran
            assert p.phase.terminated or p.phase is P or p.name in draining
        if p.name in plan.drain:
            assert p.phase is R and p.name not in draining
    assert not set(plan.drain) & set(plan.delete)
    assert len(plan.delete) == len(set(plan.delete))


def test_a_trainer_that_can_never_start_fails_the_job_with_its_reason():
    stuck = pod("a", P, exit=TrainerExit.CANNOT_START, message="trainer pod a: image 'nope:1' cannot be pulled")
    plan = plan_trainers(2, [stuck, pod("b")], {}, 10, 60)
    assert plan.fatal == (TrainerExit.CANNOT_START, "trainer pod a: image 'nope:1' cannot be pulled")


def test_no_trainer_is_started_once_the_data_is_all_consumed():
    """The job's last second: rank 0 writes the model while its peers exit 0; nobody replaces them."""
    peers_done = [pod("a"), pod("b", S, exit=TrainerExit.SUCCEEDED), pod("c", S, exit=TrainerExit.SUCCEEDED)]
    plan = plan_trainers(3, peers_done, {}, 10, 60, data_done=True)
    assert plan.create == 0 and set(plan.delete) == {"b", "c"} and plan.exited == (("b", 0), ("c", 0))
    # Even a crash then is not replaced: there is nothing left to train on.
    crashed = plan_trainers(2, [pod("a"), pod("b", F, exit=TrainerExit.FAILED, message="exit 1")], {}, 10, 60,
                            data_done=True)
    assert crashed.create == 0 and crashed.failures == (("b", "exit 1"),)


def test_the_finishing_trainer_lost_once_the_data_is_consumed_is_replaced_by_one():
    """Rank 0 evicted (or crashed) while writing the model: nobody is left to finish, so one trainer
    is started to finish (found on the plane: the job waited for ever)."""
    evicted = plan_trainers(3, [pod("a", F, exit=TrainerExit.PREEMPTED, message="evicted")], {}, 10, 60, data_done=True)
    assert evicted.create == 1
    crashed = plan_trainers(3, [pod("a", F, exit=TrainerExit.FAILED, message="exit 1")], {}, 10, 60, data_done=True)
    assert crashed.create == 1 and crashed.failures == (("a", "exit 1"),)


def test_a_trainer_that_left_unasked_is_replaced_only_after_a_fresh_status():
    """Exit 0 without a drain: the status this round was read before the exit and may be stale
    (the job finished in between); the next round's status decides."""
    first = plan_trainers(2, [pod("a"), pod("b", S, exit=TrainerExit.SUCCEEDED)], {}, 10, 60)
    assert first.create == 0 and first.delete == ("b",)
    # Next round: b is gone; the job still runs (its master went away and came back, say): replace it.
    assert plan_trainers(2, [pod("a")], {}, 11, 60).create == 1
    # A drained trainer's exit is asked for: the desired count already says whether to replace it.
    drained = plan_trainers(2, [pod("a"), pod("b", S, exit=TrainerExit.SUCCEEDED), pod("c", P)], {"b": 5.0}, 10, 60)
    assert drained.create == 0 and drained.delete == ("b",)
    assert plan_trainers(3, [pod("a"), pod("b", S, exit=TrainerExit.SUCCEEDED)], {"b": 5.0}, 10, 60).create == 2


def test_trainers_held_for_the_sidecars_decision_are_not_replaced_yet():
    # Two of four preempted: their pods are gone. Held, nothing is created; once released, the rest.
    pods = [pod("a"), pod("b")]
    assert plan_trainers(4, pods, {}, 10, 60, held=("c", "d")).create == 0
    assert plan_trainers(4, pods, {}, 10, 60, held=("d",)).create == 1
    assert plan_trainers(4, pods, {}, 10, 60).create == 2
    # A held trainer whose pod is still there (terminating, still listed) counts once, as live: the place of
    # another that crashed meanwhile is filled at once.
    pods = [pod("a"), pod("b"), pod("c"), pod("d", F, exit=TrainerExit.PREEMPTED)]
    plan = plan_trainers(4, pods, {}, 10, 60, held=("c",))
    assert plan.create == 1 and plan.relaunched == ("d",)
