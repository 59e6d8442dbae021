"""The launcher gives new trainers the plan's nodes that no staying trainer holds or prefers yet."""

from __future__ import annotations

from dataclasses import replace

from rich.console import Console

from edl.api.cluster import PodPhase, TrainerPod
from edl.launcher.core import Launcher
from tests.clock import FakeClock
from tests.unit.launcher.test_job_end import RUNNING, SPEC, Cluster, Master


class PlacingCluster(Cluster):
    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, str | None] = {}

    def create_trainer(self, name: str, node: str | None = None) -> None:
        self.nodes[name] = node
        self.created.append(name)
        self.pods[name] = TrainerPod(name, PodPhase.PENDING, 0.0, None, hint=node)


def test_new_trainers_prefer_the_planned_nodes_left_and_a_size_without_nodes_prefers_none():
    cluster = PlacingCluster()
    clock = FakeClock()
    la = Launcher(SPEC, cluster, console=Console(quiet=True), clock=clock, sleep=clock.sleep)
    cluster.pods["j-t1"] = TrainerPod("j-t1", PodPhase.RUNNING, 0.0, "n1")
    cluster.pods["j-t2"] = TrainerPod("j-t2", PodPhase.PENDING, 0.0, None, hint="n0")  # hinted, not bound yet
    la.counter = 2
    grown = replace(RUNNING, epochs_completed=0, done_rows=(0, 0), desired_trainers=4,
                    node_hints=("n0", "n0", "n1", "n2"))
    la.master = Master([grown])
    la.tick()
    # n1 is held by j-t1 and one n0 is preferred by j-t2: the two new ones get the other n0 and n2.
    assert sorted(cluster.nodes.values()) == ["n0", "n2"]
    la.master = Master([replace(grown, desired_trainers=4 + 1, node_hints=())])
    la.tick()
    assert cluster.nodes[cluster.created[-1]] is None


class DrainingMaster(Master):
    def __init__(self, views) -> None:
        super().__init__(views)
        self.drained: list[str] = []

    def drain(self, name: str) -> bool:
        self.drained.append(name)
        return True


def test_a_shrink_drains_the_trainer_on_the_node_the_plan_dropped_not_the_youngest():
    cluster = PlacingCluster()
    clock = FakeClock()
    la = Launcher(SPEC, cluster, console=Console(quiet=True), clock=clock, sleep=clock.sleep)
    cluster.pods["j-t1"] = TrainerPod("j-t1", PodPhase.RUNNING, 0.0, "n0")
    cluster.pods["j-t2"] = TrainerPod("j-t2", PodPhase.RUNNING, 0.0, "n1")
    la.counter = 2
    la.master = DrainingMaster([replace(RUNNING, epochs_completed=0, done_rows=(0, 0), desired_trainers=1,
                                        node_hints=("n1",))])
    la.first_seen = {"j-t1": 0.0, "j-t2": 5.0}  # j-t2 is the younger: without a plan it would go
    la.tick()
    assert la.master.drained == ["j-t1"]
