"""The one narrow interface between the launcher and a cluster, whichever it is.

Three implementations: ``KubeCluster`` (pods on Kubernetes), ``LocalCluster``
(processes on this machine, what ``edl train`` uses) and ``SimCluster`` (pods in
the simulator's virtual time). The launcher's logic sees only this.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from edl.autoscale.model import PodPhase


class TrainerExit(str, Enum):
    """Why a trainer pod ended; decides relaunch, failure count or job failure."""

    SUCCEEDED = "succeeded"  # exit 0: drained, or the job is over
    PREEMPTED = "preempted"  # evicted or preempted (137 without OOMKilled, deleted by the scheduler)
    NODE_LOST = "node_lost"  # its node went away
    OOM_KILLED = "oom_killed"  # the memory limit is too small: retrying cannot help
    USER_ERROR = "user_error"  # exit 2: bad input, named in the message
    FAILED = "failed"  # anything else: counts towards --max-trainer-failures


@dataclass(frozen=True)
class TrainerPod:
    name: str
    phase: PodPhase
    created_at: float  # seconds, on the launcher's clock
    node: str | None = None
    exit: TrainerExit | None = None  # set once terminated
    message: str = ""  # for a terminated pod: what happened, one line


@dataclass(frozen=True)
class MasterEndpoint:
    address: str  # host:port the launcher (and trainers) reach the master at
    token: str
    adopted: bool  # the job's objects existed already (a retried launcher)


class Cluster(Protocol):
    def ensure_job(self) -> MasterEndpoint:
        """Create the job's token, master (with its sidecar) and master address if missing; adopt them if not."""
        ...

    def master_alive(self) -> bool:
        """The master exists and has not terminated (it may still be starting)."""
        ...

    def recreate_master(self) -> None:
        """Replace a lost master; it resumes from the job's last checkpoint."""
        ...

    def trainers(self) -> list[TrainerPod]:
        """Every trainer of the job that still exists, terminated ones included until deleted."""
        ...

    def create_trainer(self, name: str) -> None: ...

    def delete_trainer(self, name: str) -> None:
        """Idempotent: deleting a trainer that is gone is fine."""
        ...

    def delete_job(self) -> None:
        """Every object of the job, gone. Idempotent."""
        ...

    def record(self, reason: str, message: str, warning: bool = False) -> None:
        """A significant event (Kubernetes Event on the launcher pod; a log line elsewhere)."""
        ...
