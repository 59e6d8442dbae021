"""The launcher at a job's end: no trainer is started once the job's data is all consumed, nor on a
status read before a trainer's exit 0 (the job may have finished in between)."""

from __future__ import annotations

from dataclasses import replace

from rich.console import Console

from edl.api.cluster import MasterEndpoint, PodPhase, TrainerExit, TrainerPod
from edl.api.master import JobStatus, JobView, Phase, TrainerState, TrainerView
from edl.api.spec import JobSpec
from edl.launcher.core import Launcher
from tests.clock import FakeClock

SPEC = JobSpec(job="j", model_def="m", data="d", epochs=2, batch_size=1, min_trainers=1, max_trainers=4,
               trainers=2, checkpoint_uri="c")
RUNNING = JobView(job="j", status=JobStatus.RUNNING, error=None, master_uid="1", phase=Phase.RUNNING, generation=1,
                  world_size=2, desired_trainers=2, unschedulable_at=None, min_trainers=1, max_trainers=4, epoch=1,
                  epochs=2, epochs_completed=1, rows_per_epoch=10, done_rows=(10, 8), step=9, loss=None,
                  trainers=(), generations=(), checkpoints=(), elapsed_s=1.0)
DATA_DONE = replace(RUNNING, epochs_completed=2, done_rows=(10, 10))  # rank 0 writes the model now
ACTIVE_T1_T2 = (TrainerView("j-t1", 0, 1, TrainerState.ACTIVE, 9), TrainerView("j-t2", 1, 2, TrainerState.ACTIVE, 9))


class Cluster:
    def __init__(self) -> None:
        self.pods: dict[str, TrainerPod] = {}
        self.created: list[str] = []

    def ensure_job(self) -> MasterEndpoint:
        return MasterEndpoint("m:1", "tok", False)

    def master_alive(self) -> bool:
        return True

    def trainers(self) -> list[TrainerPod]:
        return list(self.pods.values())

    def create_trainer(self, name: str, node: str | None = None) -> None:
        self.created.append(name)
        self.pods[name] = TrainerPod(name, PodPhase.RUNNING, 0.0, "node")

    def delete_trainer(self, name: str) -> None:
        self.pods.pop(name, None)

    def exit(self, name: str) -> None:
        self.pods[name] = TrainerPod(name, PodPhase.SUCCEEDED, 0.0, "node", TrainerExit.SUCCEEDED)

    def record(self, reason: str, message: str, warning: bool = False) -> None:
        pass


class Master:
    def __init__(self, views: list[JobView]) -> None:
        self.views = views
        self.exits: list[tuple[str, int]] = []

    def status(self) -> JobView:
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]

    def report_exit(self, trainer: str, code: int, preempted: bool = False) -> None:
        self.exits.append((trainer, code))


def launcher(views: list[JobView]) -> tuple[Launcher, Cluster]:
    cluster = Cluster()
    clock = FakeClock()
    la = Launcher(SPEC, cluster, console=Console(quiet=True), clock=clock, sleep=clock.sleep)
    la.master = Master(views)
    for name in ("j-t1", "j-t2"):
        cluster.pods[name] = TrainerPod(name, PodPhase.RUNNING, 0.0, "node")
    la.counter = 2
    return la, cluster


def test_peers_that_exit_while_rank_0_writes_the_model_are_not_replaced():
    la, cluster = launcher([DATA_DONE, DATA_DONE, replace(DATA_DONE, status=JobStatus.SUCCEEDED)])
    cluster.exit("j-t2")
    assert la.tick() is None and la.tick() is None
    assert la.tick().status is JobStatus.SUCCEEDED
    assert cluster.created == [] and la.master.exits == [("j-t2", 0)]


def test_a_status_read_before_an_exit_0_starts_nothing_the_next_round_decides():
    # This round's status predates the end; the trainer exited 0 just after it was read.
    la, cluster = launcher([RUNNING, DATA_DONE])
    cluster.exit("j-t2")
    assert la.tick() is None and cluster.created == []
    assert la.tick() is None and cluster.created == []  # the fresh status says the data is done
    # Had the job still needed it (a trainer that gave up on a master that then came back), the
    # next round replaces it.
    la, cluster = launcher([RUNNING, RUNNING])
    cluster.exit("j-t2")
    la.tick()
    assert cluster.created == []
    la.tick()
    assert cluster.created == ["j-t3"]


def test_a_pod_that_vanished_before_its_exit_was_seen_is_reported_as_a_kill_once():
    # Deleted by force (or gracefully between two rounds): no exit to see, and no process left. The master
    # hears of it at once instead of waiting out the trainer's lease; an exit already reported is not again.
    la, cluster = launcher([RUNNING])
    la.tick()
    del cluster.pods["j-t2"]
    la.tick()
    assert la.master.exits == [("j-t2", 137)]
    cluster.exit("j-t1")
    la.tick()  # reported with its code, and deleted
    la.tick()
    assert la.master.exits == [("j-t2", 137), ("j-t1", 0)]


def test_an_adopted_job_keeps_draining_what_the_launcher_before_drained_and_drains_no_other():
    # The launcher before this one (killed, its command run again) asked the master to drain j-t3: the
    # master says so; this one neither drains a second trainer for the same scale-down nor replaces j-t3.
    views = [replace(RUNNING, trainers=(TrainerView("j-t1", 0, 1, TrainerState.ACTIVE, 9),
                                        TrainerView("j-t2", 1, 2, TrainerState.ACTIVE, 9),
                                        TrainerView("j-t3", None, 3, TrainerState.DRAINING, 9)))]
    la, cluster = launcher(views)
    cluster.pods["j-t3"] = TrainerPod("j-t3", PodPhase.RUNNING, 0.0, "node")
    la.counter = 3
    la.tick()  # (Master has no drain: asking it to drain one more would fail here)
    assert "j-t3" in la.draining and cluster.created == []
    cluster.exit("j-t3")
    la.tick()
    la.tick()
    assert cluster.created == [] and la.master.exits == [("j-t3", 0)] and set(cluster.pods) == {"j-t1", "j-t2"}


def test_an_adopting_launcher_numbers_after_every_trainer_its_master_registered_gone_ones_too():
    # The soak's failure: the launcher before this one started j-t7, drained it and removed it, then was
    # killed. j-t7 is neither a pod nor in the status's trainers, but the master's books refuse it back
    # ("already left"); this launcher hears the master's highest number and starts j-t8.
    view = replace(RUNNING, desired_trainers=3, highest_trainer_number=7, trainers=ACTIVE_T1_T2)
    la, cluster = launcher([view])
    la.counter = 0  # a fresh launcher knows only what it sees
    la.tick()
    assert cluster.created == ["j-t8"]


def test_an_adopting_launcher_counts_a_trainer_the_master_let_go_as_leaving_not_as_excess_of_another():
    # The launcher before this one drained j-t3 and was killed; the master switched without j-t3 (gone from
    # its trainers, listed as departing until its exit is reported) while its process still ends. Counted as
    # live, it would make one of j-t1, j-t2 excess.
    view = replace(RUNNING, trainers=ACTIVE_T1_T2, highest_trainer_number=4, departing=("j-t3",))
    la, cluster = launcher([view])
    la.counter = 0
    cluster.pods["j-t3"] = TrainerPod("j-t3", PodPhase.RUNNING, 0.0, "node")
    # j-t4 was started with j-t3 and has not registered yet (j-t4 has, as its number says): it is live.
    cluster.pods["j-t4"] = TrainerPod("j-t4", PodPhase.PENDING, 0.0, None)
    view = replace(view, desired_trainers=3)
    la.master = Master([view])
    la.tick()  # (Master has no drain: draining one would fail here)
    assert "j-t3" in la.draining and "j-t4" not in la.draining and cluster.created == []
    cluster.exit("j-t3")
    la.tick()
    la.tick()
    assert cluster.created == [] and set(cluster.pods) == {"j-t1", "j-t2", "j-t4"}
    assert la.master.exits == [("j-t3", 0)]


def test_a_drain_asked_of_a_master_since_replaced_is_void_once_the_new_one_lists_the_trainer():
    # The launcher drained j-t2; the master died before its switch. The new master (another uid) has j-t2
    # back as a member: the launcher no longer waits for it to leave, nor deletes it at the drain timeout.
    la, cluster = launcher([RUNNING])
    la.tick()  # master "1" seen
    la.draining["j-t2"], la.drained_by["j-t2"] = 0.0, "1"
    la.master = Master([replace(RUNNING, master_uid="2", trainers=ACTIVE_T1_T2)])
    la.tick()
    assert la.draining == {} and la.drained_by == {}
    # One asked of the master that answers stands, even on a status that still lists the trainer active,
    # and so it does on a late answer of the master before it.
    la.draining["j-t2"], la.drained_by["j-t2"] = 0.0, "2"
    la.tick()
    la.master = Master([replace(RUNNING, master_uid="1", trainers=ACTIVE_T1_T2)])
    la.tick()
    assert "j-t2" in la.draining
