"""The launcher with a status watch (``edl.launcher.watch``): it asks its master for the status about once
per long poll while nothing changes, not on every round; a change reaches it at once; and a round never
decides on a copy that may predate what it knows: after it acted, after its trainers changed, or a copy
older than a status it already used."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from rich.console import Console

from edl.api.cluster import MasterEndpoint, PodPhase, TrainerExit, TrainerPod
from edl.api.master import JobStatus, JobView
from edl.errors import UserError
from edl.launcher.core import Launcher
from edl.launcher.watch import Reading, StatusWatch
from tests.clock import FakeClock
from tests.unit.launcher.test_api_away import SPEC, view
from tests.unit.launcher.test_job_end import DATA_DONE, RUNNING

ENDPOINT = MasterEndpoint("m:1", "tok", False)


class Cluster:
    """Trainer processes in memory (real time or not: it keeps no clock); counts the launcher's rounds."""

    def __init__(self, running: tuple[str, ...] = ()) -> None:
        self.pods = {name: TrainerPod(name, PodPhase.RUNNING, 0.0, "node") for name in running}
        self.created: list[str] = []
        self.lock = threading.Lock()
        self.rounds = 0

    def ensure_job(self) -> MasterEndpoint:
        return ENDPOINT

    def master_alive(self) -> bool:
        self.rounds += 1  # the first thing each round asks
        return True

    def trainers(self) -> list[TrainerPod]:
        with self.lock:
            return list(self.pods.values())

    def create_trainer(self, name: str, node: str | None = None) -> None:
        with self.lock:
            self.created.append(name)
            self.pods[name] = TrainerPod(name, PodPhase.RUNNING, 0.0, "node")

    def delete_trainer(self, name: str) -> None:
        with self.lock:
            self.pods.pop(name, None)

    def exit(self, name: str) -> None:
        with self.lock:
            self.pods[name] = TrainerPod(name, PodPhase.SUCCEEDED, 0.0, "node", TrainerExit.SUCCEEDED)

    def delete_job(self) -> None:
        pass

    def record(self, reason: str, message: str, warning: bool = False) -> None:
        pass


class LongPollMaster:
    """A master in memory on a fake clock whose status long-polls as the real one does: a wait with
    ``after`` ends when what the launcher acts on has changed (``set``), else once the clock has moved
    ``wait_s`` on (never by itself: ``clock.sleep`` ends the waits it passes)."""

    def __init__(self, desired: int, clock: FakeClock | None = None) -> None:
        self.changed = threading.Condition()
        self.clock = clock or FakeClock()
        moved = self.clock.on_sleep
        self.clock.on_sleep = lambda: (moved(), self.wake())
        self.desired, self.status_now, self.version = desired, JobStatus.RUNNING, 1
        self.reads = 0  # status answers given, long polls and plain reads alike
        self.polls = 0  # long polls waiting now

    def set(self, desired: int | None = None, status: JobStatus | None = None) -> None:
        with self.changed:
            self.desired = desired or self.desired
            self.status_now = status or self.status_now
            self.version += 1
            self.changed.notify_all()

    def wake(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def status(self, after: int = 0, wait_s: float = 0.0) -> JobView:
        with self.changed:
            if after and wait_s > 0:
                until = self.clock() + wait_s
                self.polls += 1
                self.changed.notify_all()
                self.changed.wait_for(lambda: self.version != after or self.clock() >= until)
                self.polls -= 1
            self.reads += 1
            return replace(view(self.desired, self.status_now), control_version=self.version)

    def wait_polled(self, timeout_s: float = 10.0) -> bool:
        """Until a long poll waits (real time, ``timeout_s`` at most)."""
        with self.changed:
            return self.changed.wait_for(lambda: self.polls > 0, timeout_s)

    def healthy(self) -> bool:
        return True

    def launcher_beat(self, budgets=None) -> None:
        pass

    def report_exit(self, name: str, code: int, preempted: bool = False) -> None:
        pass

    def shutdown(self) -> None:
        pass


def until(predicate, timeout_s: float = 10.0) -> bool:
    """Until ``predicate()`` holds (real time: another thread's doing; ``timeout_s`` at most)."""
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.005)
    return predicate()


@pytest.mark.timeout(60)
def test_a_watching_launcher_asks_once_per_long_poll_while_nothing_changes_and_hears_a_change_at_once():
    # The launcher, its watch and the master's long poll on one fake clock, which only the test moves: a
    # long poll ends by a change or when the test moves the clock past it; the launcher's rounds go on
    # meanwhile (between rounds it waits for the watch's next reading, ``poll_s`` at most, in real time).
    clock = FakeClock()
    master, cluster = LongPollMaster(desired=2, clock=clock), Cluster()
    la = Launcher(SPEC, cluster, console=Console(quiet=True), clock=clock, sleep=clock.sleep,
                  master_factory=lambda endpoint: master, trainer_prefix="j-t",
                  status_watch=StatusWatch(lambda endpoint: master, wait_s=5.0))
    la.start()
    final: list[JobView] = []
    loop = threading.Thread(target=lambda: final.append(la.run(poll_s=0.01)), daemon=True)
    loop.start()

    def rounds(n: int) -> None:
        start = cluster.rounds
        assert until(lambda: cluster.rounds >= start + n), f"the launcher's loop stopped at round {cluster.rounds}"

    try:
        assert until(lambda: cluster.created == ["j-t1", "j-t2"]) and master.wait_polled()
        rounds(5)  # the trainers are started; the rounds after that read afresh once
        reads = master.reads
        rounds(40)  # nothing changes: the watch's one long poll is still waiting
        assert master.reads == reads
        clock.sleep(5.0)  # its wait has passed: answered, and the watch asks again
        assert until(lambda: master.reads == reads + 1) and master.wait_polled()
        rounds(40)
        assert master.reads == reads + 1  # one read per long poll
        moved = clock()
        master.set(desired=3)  # the sidecar, `edl scale`
        assert until(lambda: len(cluster.created) == 3)
        assert cluster.created == ["j-t1", "j-t2", "j-t3"] and clock() == moved  # at once, not the 5 s poll
        master.set(status=JobStatus.SUCCEEDED)
        loop.join(10)
        assert final and final[0].status is JobStatus.SUCCEEDED
    finally:
        la.shutdown(delete=False)


class Watch:
    """A ``StatusWatch`` whose readings the test sets (no thread)."""

    def __init__(self) -> None:
        self.reading: Reading | None = None

    def show(self, view: JobView | None, error: Exception | None = None) -> None:
        serial = self.reading.serial + 1 if self.reading else 1
        self.reading = Reading(ENDPOINT, view, error, serial)  # type: ignore[arg-type]

    def follow(self, endpoint: MasterEndpoint) -> None:
        pass

    def latest(self) -> Reading | None:
        return self.reading

    def latest_serial(self) -> int:
        return self.reading.serial if self.reading else 0

    def wait_newer(self, serial: int, timeout_s: float) -> None:
        pass

    def stop(self) -> None:
        pass


class Master:
    """Answers the views given, in turn (the last one from then on); counts the reads."""

    def __init__(self, *views: JobView) -> None:
        self.views, self.reads = list(views), 0
        self.drained: list[str] = []
        self.exits: list[tuple[str, int]] = []
        self.starting: set[str] = set()  # trainers that never joined a generation

    def status(self) -> JobView:
        self.reads += 1
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]

    def drain(self, name: str) -> bool:
        self.drained.append(name)
        return True

    def report_exit(self, name: str, code: int, preempted: bool = False) -> None:
        self.exits.append((name, code))
        if preempted and name in self.starting:  # as the real one does where the sidecar sizes the job
            self.views = [replace(v, held_replacements=(*v.held_replacements, name)) for v in self.views]


def watching(master: Master, cluster: Cluster) -> tuple[Launcher, Watch]:
    clock, watch = FakeClock(), Watch()
    la = Launcher(SPEC, cluster, console=Console(quiet=True), clock=clock, sleep=clock.sleep,
                  trainer_prefix="j-t", status_watch=watch)  # type: ignore[arg-type]
    la.master, la.endpoint, la.counter = master, ENDPOINT, 2  # type: ignore[assignment]
    return la, watch


def test_a_copy_older_than_the_status_used_is_not_used_a_scale_down_does_not_flap():
    # The launcher read the master itself and drained to the new size; the watch's copy from before the
    # scale-down is still there. Taken, it would start a trainer in the drained one's place.
    cluster = Cluster(running=("j-t1", "j-t2"))
    master = Master(replace(view(1), control_version=5))
    la, watch = watching(master, cluster)
    watch.show(replace(view(2), control_version=4))
    la.tick()  # the first round reads the master: scaled down to 1
    assert len(master.drained) == 1 and master.reads == 1
    la.tick()  # its trainers, seen for the first time, were a change: read afresh
    assert master.reads == 2
    la.tick()  # nothing changed, but the watch's copy is older than what it used: read afresh
    assert master.reads == 3 and cluster.created == []
    watch.show(replace(view(1), control_version=6))
    la.tick()  # a newer copy is used as it is
    assert master.reads == 3 and cluster.created == []


def test_after_a_trainer_exits_the_next_round_reads_the_master_not_the_copy():
    # The watch's copy predates the job's data running out; a trainer exits 0 (the job is finishing).
    cluster = Cluster(running=("j-t1", "j-t2"))
    master = Master(replace(RUNNING, control_version=3), replace(RUNNING, control_version=3),
                    replace(DATA_DONE, control_version=4))
    la, watch = watching(master, cluster)
    watch.show(replace(RUNNING, control_version=3))
    la.tick()  # reads the master (the first round, and the first sight of its trainers)
    la.tick()
    la.tick()
    assert master.reads == 2  # nothing changed: the copy
    cluster.exit("j-t2")
    la.tick()  # the exit is reported; the copy says "running, data left"; nothing started on that
    assert master.exits == [("j-t2", 0)] and cluster.created == []
    la.tick()  # the fresh read says the data is done: no replacement
    assert master.reads == 3 and cluster.created == []


def test_a_refusal_the_watch_heard_ends_the_round_as_the_launchers_own_read_would():
    cluster = Cluster(running=("j-t1", "j-t2"))
    la, watch = watching(Master(replace(view(2), control_version=1)), cluster)
    la.tick()
    la.tick()
    watch.show(None, UserError("master refused our job token (401)"))
    with pytest.raises(UserError, match="401"):
        la.tick()


@pytest.mark.timeout(30)
def test_the_watch_follows_a_new_master_and_drops_what_the_old_one_said():
    old, new = LongPollMaster(desired=2), LongPollMaster(desired=3)
    links = {"m:1": old, "m:2": new}
    watch = StatusWatch(lambda endpoint: links[endpoint.address], wait_s=5.0)
    try:
        watch.follow(ENDPOINT)
        watch.wait_newer(0, 5.0)
        assert watch.latest().view.desired_trainers == 2
        moved = MasterEndpoint("m:2", "tok", False)
        watch.follow(moved)  # the launcher replaced its master
        assert watch.latest() is None
        old.set(desired=4)  # ends the old master's long poll: its answer is not kept
        watch.wait_newer(0, 5.0)
        reading = watch.latest()
        assert reading.endpoint == moved and reading.view.desired_trainers == 3
    finally:
        watch.stop()
        old.set(), new.set()  # end the long poll in flight


def settled(desired: int) -> tuple[Launcher, Master, Cluster]:
    """A launcher past its first rounds with ``desired`` trainers running, the watch's copy current."""
    cluster = Cluster(running=tuple(f"j-t{i}" for i in range(1, desired + 1)))
    master = Master(replace(view(desired), control_version=3))
    la, watch = watching(master, cluster)
    watch.show(replace(view(desired), control_version=3))
    for _ in range(3):
        la.tick()
    return la, master, cluster


def test_a_preempted_trainer_is_replaced_only_if_a_fresh_read_still_asks_for_it():
    # The sidecar handed the room back (4 -> 1, for a higher-priority service) after the watch's copy was
    # taken; the scheduler preempts a trainer for that service. On the copy (4) the round would start a
    # replacement into the room just handed back: it reads the size afresh first, and drains instead.
    la, master, cluster = settled(4)
    reads = master.reads
    la.tick()
    assert master.reads == reads and cluster.created == [] and master.drained == []  # nothing changed: the copy
    master.views = [replace(view(1), control_version=4)]  # the sidecar's decision, not in the watch's copy yet
    cluster.pods["j-t3"] = TrainerPod("j-t3", PodPhase.FAILED, 0.0, "node", TrainerExit.PREEMPTED)
    la.tick()
    assert master.reads == reads + 1 and cluster.created == [] and len(master.drained) == 2


def test_a_preempted_trainer_is_replaced_at_once_where_the_size_still_asks_for_it():
    la, master, cluster = settled(2)
    reads = master.reads
    cluster.pods["j-t2"] = TrainerPod("j-t2", PodPhase.FAILED, 0.0, "node", TrainerExit.PREEMPTED)
    la.tick()
    assert cluster.created == ["j-t3"] and master.reads == reads + 1  # read afresh once, then replaced


def test_a_trainer_preempted_as_it_started_waits_for_the_sidecar_however_the_decisions_race():
    # The sidecar has not decided yet (the master still asks for 4) when the scheduler preempts a trainer
    # that had not joined: the master is told of the preemption before the size is read afresh, and holds
    # its place for the sidecar's next decision. A replacement started now would only sit Pending.
    la, master, cluster = settled(4)
    master.starting.add("j-t4")
    cluster.pods["j-t4"] = TrainerPod("j-t4", PodPhase.FAILED, 0.0, "node", TrainerExit.PREEMPTED)
    la.tick()
    assert master.exits == [("j-t4", 1)] and cluster.created == []  # told once, before the fresh read
    master.views = [replace(view(4), control_version=5)]  # the sidecar's decision released it: still 4
    la.tick()
    assert cluster.created == ["j-t5"]
