"""The last checkpoint of a cancelled job fits in what the step pod's grace period leaves."""

from __future__ import annotations

from edl.launcher.kube import CLEANUP_S, FINAL_CHECKPOINT_S, final_checkpoint_budget


def test_the_last_checkpoint_budget_follows_the_pods_grace_period():
    assert final_checkpoint_budget(None) == FINAL_CHECKPOINT_S  # not in a pod: the full budget
    assert final_checkpoint_budget(30) == FINAL_CHECKPOINT_S  # Kubernetes' (and KFP's) default fits it
    assert final_checkpoint_budget(60) == FINAL_CHECKPOINT_S  # never more than asked for
    assert final_checkpoint_budget(15) == 15 - CLEANUP_S  # a short grace: what is left after the cleanup
    assert final_checkpoint_budget(5) == 0.0  # nothing left: no checkpoint is started


def test_a_step_pod_below_its_trainers_priority_is_told_it_goes_first():
    from edl.launcher.kube import preemptible_below_trainers

    low = {"metadata": {"name": "edl-low"}, "value": 100}
    said = preemptible_below_trainers({"spec": {}}, low)  # no PriorityClass: priority 0
    assert said is not None and "priority 0, below its trainers' 100" in said and "PriorityClass edl-low" in said
    assert preemptible_below_trainers({"spec": {"priority": 100}}, low) is None
    assert preemptible_below_trainers({"spec": {"priority": 1000}}, low) is None
    assert preemptible_below_trainers({"spec": {}}, None) is None  # trainers of no class: priority 0 too
