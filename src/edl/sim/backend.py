"""The simulator's cluster as a launcher/sidecar backend, in virtual time.

``SimCluster`` implements the launcher's ``Cluster``, ``SimClusterView`` the
sidecar's ``ClusterView`` and ``SimMaster`` the master's ``ControlLink`` both use, over one
``Simulation`` in which the job is *external*: the engine's own controllers and
autoscaler leave its trainers alone, and the real ``Launcher`` and ``Sidecar``
manage them. The master is the simulator's job model (progress at the modelled
throughput of the running trainers), not the HTTP master: no Paddle runs here.

``VirtualDriver`` advances the simulation whenever the launcher sleeps and runs
the sidecar every period, so a whole run is a loop over virtual time.
"""

from __future__ import annotations

from typing import Any

from edl.api.cluster import (DecidesAlone, JobDemand, MasterEndpoint, Node, Pod, PodPhase, PodTotals, Resources, SizeReason,
                             TrainerPod)
from edl.api.master import BudgetView, CheckpointRecord, JobStatus, JobView, Phase
from edl.autoscale.sidecar import Sidecar
from edl.errors import TemporaryError, UserError
from edl.sim.engine import SimPod, Simulation

MASTER = Resources(0.5, 1.0, 0.0)


class SimCluster:
    def __init__(self, sim: Simulation, job: str) -> None:
        self.sim = sim
        self.job = job
        self.spec = sim.jobs[job].spec
        self.trainer_prefix = f"{job}-trainer-"
        self.deleted: list[str] = []
        self.address = f"sim/{job}"

    @property
    def now(self) -> float:
        return self.sim.now

    def _pods(self, role: str) -> list[SimPod]:
        return [p for p in self.sim.by_owner.get(self.job, {}).values()
                if p.role == role and p.terminating_until is None]

    def ensure_job(self) -> MasterEndpoint:
        adopted = bool(self._pods("master"))
        if not adopted:
            self.recreate_master()
        return MasterEndpoint(self.address, "sim", adopted)

    def master_alive(self) -> bool:
        return bool(self._pods("master")) or self.sim.jobs[self.job].completed_at is not None

    def recreate_master(self) -> str:
        for p in self._pods("master"):
            self.sim._delete(p)
        pod = self.sim._create(self.job, "job", "master", MASTER, self.spec.priority, self.now, self.spec.startup_s, 0)
        pod.name = f"{self.job}-master"
        return self.address

    def trainers(self) -> list[TrainerPod]:
        out = []
        for p in self._pods("trainer"):
            phase = PodPhase.RUNNING if p.running else PodPhase.PENDING
            node = None if p.node is None else self.sim.node_names[p.node]
            out.append(TrainerPod(p.name or f"p{p.id}", phase, p.created, node,
                                  hint=None if p.hint is None else self.sim.node_names[p.hint]))
        return out

    def create_trainer(self, name: str, node: str | None = None) -> None:
        j = self.spec
        pod = self.sim._create(self.job, "job", "trainer", j.trainer, j.priority, self.now, j.startup_s, j.drain_s)
        pod.name = name
        pod.hint = self.sim.node_index.get(node) if node is not None else None

    def delete_trainer(self, name: str) -> None:
        for p in self._pods("trainer"):
            if p.name == name:
                self.sim._delete(p, self.now)  # held for its drain time, like a pod in its grace period

    def delete_job(self) -> None:
        for p in list(self.sim.by_owner.get(self.job, {}).values()):
            self.sim._delete(p)
        js = self.sim.jobs[self.job]
        js.cancelled = True  # its controller must not recreate the fixed pods

    def record(self, reason: str, message: str, warning: bool = False) -> None:
        self.sim.events.append((self.now, self.job, reason, message))


class SimMaster:
    """The master's ``ControlLink`` (what the launcher and the sidecar ask), answered from the simulated job.

    Like the real master it cannot be reached while its pod is not running (not started yet, or
    lost), unless the job is already complete.
    """

    def __init__(self, sim: Simulation, job: str) -> None:
        self.sim = sim
        self.job = job
        self.unschedulable_at: float | None = None
        self.checkpoints = 0

    def _js(self):
        return self.sim.jobs[self.job]

    def healthy(self) -> bool:
        alive = any(p.role == "master" and p.running for p in self.sim.by_owner.get(self.job, {}).values())
        return alive or self._js().completed_at is not None

    def _reachable(self) -> None:
        if not self.healthy():
            raise TemporaryError(f"simulated master of {self.job} is not running")

    def status(self) -> JobView | None:
        if not self.healthy():
            return None
        js, spec = self._js(), self._js().spec
        running = sum(1 for p in self.sim.by_owner.get(self.job, {}).values() if p.role == "trainer" and p.running)
        work = spec.work or 0.0
        done = js.completed_at is not None
        return JobView(
            job=self.job, status=JobStatus.SUCCEEDED if done else JobStatus.RUNNING, error=None, master_uid="sim",
            phase=Phase.RUNNING, generation=0, world_size=running, desired_trainers=js.target,
            unschedulable_at=self.unschedulable_at, min_trainers=spec.min, max_trainers=spec.max, epoch=0, epochs=1,
            epochs_completed=1 if done else 0, rows_per_epoch=int(work), done_rows=(int(min(js.done, work)),),
            step=0, loss=None, trainers=(), generations=(),
            checkpoints=tuple(CheckpointRecord(k, "", 0.0, 0) for k in range(self.checkpoints)),
            elapsed_s=self.sim.now, node_hints=js.hints,
        )

    def summary(self) -> dict[str, Any] | None:
        st = self.status()  # the simulated job keeps no run summary beyond its status
        return None if st is None else st.to_json()

    def scale(self, trainers: int, nodes: tuple[str, ...] = (), reason: SizeReason | None = None,
              released: tuple[str, ...] | None = None) -> int:
        # Simulated trainers are not told to stop (a preempted one is deleted at once): none is ever held.
        self._reachable()
        spec = self._js().spec
        if not spec.min <= trainers <= spec.max:
            raise UserError(f"--trainers {trainers} is outside this job's range {spec.min}..{spec.max}")
        self._js().target = trainers
        self._js().hints = tuple(nodes)
        return trainers

    def report_unschedulable(self, count: int) -> int:
        self._reachable()
        js = self._js()
        js.target = max(js.spec.min, js.target - count)
        self.unschedulable_at = self.sim.now
        return js.target

    def report_exit(self, trainer: str, code: int, preempted: bool = False) -> None:
        self._reachable()

    def drain(self, trainer: str) -> bool:
        self._reachable()
        return True  # a simulated trainer leaves at its next step: the pod's drain time

    def request_checkpoint(self) -> None:
        self._reachable()
        self.checkpoints += 1  # the simulated job checkpoints at once

    def fail_job(self, message: str, user: bool = False) -> None:
        self._reachable()

    def shutdown(self) -> None:
        self._reachable()

    def launcher_beat(self, budgets: dict[str, BudgetView] | None = None) -> None:
        self._reachable()  # the simulated job has no dead-man switch: its launcher never dies unheard


class SimClusterView(DecidesAlone):
    """What the sidecar sees of the simulated cluster, and a board where demands are published."""

    def __init__(self, sim: Simulation, board: dict[str, tuple[JobDemand, float]] | None = None,
                 lease_s: float = 30.0) -> None:
        self.sim = sim
        self.board = {} if board is None else board
        self.lease_s = lease_s
        self.up = True  # tests switch it off to play an unreachable API
        self._totals: PodTotals | None = None

    def healthy(self) -> bool:
        return self.up

    def nodes(self) -> list[Node]:
        return [n for n in self.sim.nodes_view() if n.allocatable.cpu > 0]  # a lost node has nothing left

    def pods(self) -> list[Pod]:
        pods, self._totals = self.sim.pods_and_totals()
        return list(pods)

    def totals(self) -> PodTotals | None:
        """The sums of the pods the last ``pods()`` returned."""
        return self._totals

    def peer_demands(self, now: float) -> list[JobDemand]:
        return [d for d, at in self.board.values() if now - at <= self.lease_s]

    def publish(self, demand: JobDemand, now: float, reason: SizeReason | None = None) -> None:
        self.board[demand.name] = (demand, now)


class VirtualDriver:
    """Advance virtual time while the launcher sleeps; run the sidecar every period."""

    def __init__(self, sim: Simulation, sidecar: Sidecar | None = None, period_s: float = 5.0) -> None:
        self.sim = sim
        self.sidecar = sidecar
        self.period_s = period_s
        self.k = 0
        self.next_decision = 0.0
        self.period_ticks = max(1, int(round(sim.sc.period_s / sim.sc.tick_s)))

    def sleep(self, seconds: float) -> None:
        target = self.sim.now + max(seconds, self.sim.sc.tick_s)
        while self.sim.now < target:
            if self.sidecar is not None and self.sim.now >= self.next_decision:
                self.sidecar.step()
                self.next_decision = self.sim.now + self.period_s
            self.sim.tick(self.k, self.period_ticks)  # other jobs, if any, keep the engine's autoscaler
            self.k += 1
            self.sim.now = self.k * self.sim.sc.tick_s

    def clock(self) -> float:
        return self.sim.now
