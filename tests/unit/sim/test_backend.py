"""The real Launcher and Sidecar on the simulator's cluster, in virtual time (the third backend)."""

from __future__ import annotations

import copy

import pytest
from rich.console import Console

from edl.api.cluster import Resources
from edl.autoscale.policy import get_policy
from edl.autoscale.sidecar import Sidecar, SidecarConfig
from edl.errors import PermanentError
from edl.launcher.core import Launcher
from edl.api.spec import JobSpec
from edl.sim.backend import SimCluster, SimClusterView, SimMaster, VirtualDriver
from edl.sim.engine import Simulation
from edl.sim.scenario import parse

SCENARIO = {
    "name": "backend", "duration_s": 100000, "period_s": 5, "preemption": True,
    "nodes": [{"count": 4, "cpu": 8, "memory_gi": 32}],
    "priorities": {"web": 1000, "batch": 0},
    "services": [{"name": "web", "priority": "web", "pod": {"cpu": 3, "memory_gi": 1}, "startup_s": 2,
                  "replicas": [[0, 0], [200, 8]]}],
    "jobs": [{"name": "train", "count": 1, "submit_at": 0, "priority": "batch", "fixed_pods": [],
              "trainer": {"cpu": 2, "memory_gi": 2}, "min": 1, "max": 8, "static": 1, "work": 5_000_000,
              "throughput": {"per_trainer": 100, "efficiency": 0.97}, "rescale_cost_s": 1, "startup_s": 2,
              "drain_s": 1}],
}
SPEC = JobSpec(job="train", model_def="m", data="d", epochs=1, batch_size=1, min_trainers=1, max_trainers=8,
               trainers=1, checkpoint_uri="c")


class World:
    def __init__(self, scenario=SCENARIO, sidecar=True, pending_timeout_s=30.0) -> None:
        self.sim = Simulation(parse(scenario), "edl", external=frozenset({"train"}))
        self.cluster = SimCluster(self.sim, "train")
        self.master = SimMaster(self.sim, "train")
        self.view = SimClusterView(self.sim)
        side = Sidecar(SidecarConfig("train", Resources(2, 2, 0), 1, 8, period_s=5, jitter_s=0), self.view,
                       self.master, get_policy("edl"), clock=lambda: self.sim.now) if sidecar else None
        self.driver = VirtualDriver(self.sim, side, period_s=5)
        self.launcher = self.new_launcher(pending_timeout_s)

    def new_launcher(self, pending_timeout_s=30.0) -> Launcher:
        return Launcher(SPEC, self.cluster, pending_timeout_s=pending_timeout_s,
                        trainer_prefix=self.cluster.trainer_prefix, console=Console(quiet=True),
                        clock=self.driver.clock, sleep=self.driver.sleep, master_factory=lambda ep: self.master)

    def run_until(self, t: float, launcher: Launcher | None = None) -> None:
        launcher = launcher or self.launcher
        while self.sim.now < t:
            assert launcher.tick() is None
            self.driver.sleep(1.0)

    def running_trainers(self) -> int:
        return sum(1 for p in self.sim.by_owner.get("train", {}).values()
                   if p.role == "trainer" and p.running and p.terminating_until is None)

    def web_running(self) -> int:
        return sum(1 for p in self.sim.by_owner.get("web", {}).values() if p.running)


def test_the_job_grows_into_idle_capacity_and_hands_it_back_within_a_period():
    w = World()
    w.launcher.start()
    w.run_until(190)
    assert w.running_trainers() == 8  # 32 idle cores, 2 per trainer, max 8
    w.run_until(200)  # web asks for 8 x 3 cores at t=200 (priority 1000, preemption on)
    while w.web_running() < 8:
        w.run_until(w.sim.now + 1)
    lag = w.sim.now - 200
    assert lag <= 5 + 2 + 1 + 1  # one sidecar period + pod start-up + drain, and a tick
    w.run_until(w.sim.now + 10)
    assert w.running_trainers() <= 3 and w.sim.jobs["train"].target <= 3  # (32 - 24 - 0.5) // 2
    assert w.launcher.failures == 0


def test_a_lost_node_s_trainers_are_replaced_without_counting_failures():
    w = World()
    w.launcher.start()
    w.run_until(100)
    before = w.running_trainers()
    node = next(p.node for p in w.sim.by_owner["train"].values() if p.role == "trainer" and p.node is not None
                and not any(q.role == "master" and q.node == p.node for q in w.sim.by_owner["train"].values()))
    lost = [p for p in w.sim.remove_node(node, w.sim.now) if p.owner == "train"]
    assert lost
    w.run_until(130)
    assert w.launcher.failures == 0
    cap = int((3 * 8 - 0.5) // 2)
    assert w.running_trainers() == min(before, cap, 8)


def test_trainers_that_stay_pending_are_removed_and_reported_and_the_sidecar_backs_off():
    sc = copy.deepcopy(SCENARIO)
    sc["nodes"] = [{"count": 1, "cpu": 5, "memory_gi": 32}]  # the master and two trainers fit
    w = World(sc, sidecar=False, pending_timeout_s=20)
    w.launcher.start()
    w.run_until(10)
    w.master.scale(6)  # someone asks for more than fits
    w.run_until(60)
    assert w.launcher.unschedulable == 4
    assert w.sim.jobs["train"].target == 2 and w.running_trainers() == 2
    assert not [t for t in w.cluster.trainers() if t.node is None]
    assert any(e[2] == "TrainersUnschedulable" for e in w.sim.events)


def test_a_retried_launcher_adopts_the_job_and_a_lost_master_is_recreated():
    w = World()
    w.launcher.start()
    w.run_until(60)
    trainers = {t.name for t in w.cluster.trainers()}
    masters = [p.id for p in w.sim.by_owner["train"].values() if p.role == "master"]
    retry = w.new_launcher()  # the step's pod was replaced; the new one runs the same command
    assert retry.start().adopted
    assert [p.id for p in w.sim.by_owner["train"].values() if p.role == "master"] == masters
    w.run_until(80, retry)
    assert {t.name for t in w.cluster.trainers()} >= trainers  # kept, not re-created
    assert retry.counter >= max(int(n.rsplit("-", 1)[1]) for n in trainers)
    for p in [p for p in w.sim.by_owner["train"].values() if p.role == "master"]:
        w.sim._delete(p)  # the master pod is lost
    w.run_until(100, retry)
    assert retry.master_restarts == 1 and w.cluster.master_alive()


def test_cancel_takes_a_checkpoint_and_leaves_no_pod_behind():
    w = World()
    w.launcher.start()
    w.run_until(50)
    assert w.launcher.final_checkpoint(20) is True and w.master.checkpoints == 1
    w.launcher.shutdown(delete=True)
    w.driver.sleep(5)
    assert not w.sim.by_owner.get("train")


def test_the_job_runs_to_completion_and_a_crash_loop_fails_it():
    sc = copy.deepcopy(SCENARIO)
    sc["jobs"][0]["work"] = 200_000
    w = World(sc)
    w.launcher.start()
    final = w.launcher.run(poll_s=1.0)
    assert final.status == "succeeded" and w.launcher.failures == 0

    from edl.api.cluster import PodPhase
    from edl.api.cluster import TrainerExit, TrainerPod

    class Crashing(SimCluster):
        def trainers(self):
            return [TrainerPod(t.name, PodPhase.FAILED, t.created_at, t.node, TrainerExit.FAILED, "exit code 1")
                    for t in super().trainers()]

    w = World()
    w.cluster = Crashing(w.sim, "train")
    w.launcher = w.new_launcher()
    w.launcher.start()
    with pytest.raises(PermanentError, match="trainer failures"):
        w.run_until(100)
