"""What everyone shares about a cluster: resources, pods and nodes as a policy sees them,
every elastic job's demand, the trainer pods the launcher manages, and the two interfaces
to a cluster (the launcher's ``Cluster`` and the sidecar's ``ClusterView``).

Plain frozen dataclasses, built by whoever observes the cluster (the sidecar's informer
cache on Kubernetes, the local processes, the simulator in virtual time). Quantities are
CPU cores, GiB of memory and whole GPUs.

Three implementations of ``Cluster``: ``KubeCluster`` (pods on Kubernetes), ``LocalCluster``
(processes on this machine, what ``edl train`` uses) and ``SimCluster`` (pods in the
simulator's virtual time). The launcher's logic sees only this.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Protocol


@dataclass(frozen=True)
class Resources:
    cpu: float = 0.0
    memory: float = 0.0
    gpu: float = 0.0

    def __add__(self, o: "Resources") -> "Resources":
        return Resources(self.cpu + o.cpu, self.memory + o.memory, self.gpu + o.gpu)

    def __sub__(self, o: "Resources") -> "Resources":
        return Resources(self.cpu - o.cpu, self.memory - o.memory, self.gpu - o.gpu)

    def scaled(self, k: float) -> "Resources":
        return Resources(self.cpu * k, self.memory * k, self.gpu * k)

    def fits_in(self, o: "Resources", eps: float = 1e-9) -> bool:
        return self.cpu <= o.cpu + eps and self.memory <= o.memory + eps and self.gpu <= o.gpu + eps


class PodPhase(str, Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminated(self) -> bool:
        return self in (PodPhase.SUCCEEDED, PodPhase.FAILED)


@dataclass(frozen=True)
class Node:
    name: str
    allocatable: Resources
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)


@dataclass(frozen=True)
class Pod:
    name: str
    requests: Resources
    phase: PodPhase
    priority: int = 0
    node: str | None = None  # None while unscheduled
    job: str | None = None  # owning elastic job, if any
    role: str = "other"  # "trainer" for elastic trainers; "fixed" for a job's other pods
    # A waiting pod's node as the scheduler chose it when it preempted pods there for it
    # (``status.nominatedNodeName``): where it will run once they are gone, whatever a model of
    # the scheduler would pick.
    nominated: str | None = None


@dataclass(frozen=True)
class JobDemand:
    """One elastic job as its sidecar publishes it."""

    name: str
    min: int
    max: int
    current: int  # the job's current desired trainer count
    trainer: Resources
    priority: int = 0
    # Optional: measured samples/s with n trainers at index n (index 0 unused, may be 0).
    throughput: tuple[float, ...] = ()
    rescale_cost_s: float = 0.0  # measured pause of one generation change
    remaining: float | None = None  # samples of work left, when the job knows (None: endless)
    # Where its trainer pods may go (``--trainer-node-selector``, ``--trainer-tolerations``):
    node_selector: tuple[tuple[str, str], ...] = ()  # (key, value): every one must be a node label
    tolerations: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect); value "": any (Exists)

    def speed(self, n: int) -> float:
        """Throughput with ``n`` trainers: measured where known, linear beyond (conservative)."""
        if n <= 0:
            return 0.0
        t = self.throughput
        if not t or len(t) < 2:
            return float(n)
        if n < len(t):
            return t[n]
        last = len(t) - 1
        per = t[last] / last if last else t[1]
        return t[last] + (n - last) * per * 0.5  # unmeasured: assume diminishing returns


def trainer_priorities(pods: list[Pod] | tuple[Pod, ...], known: dict[str, int] | None = None) -> dict[str, int]:
    """Each job's priority as the scheduler resolved it for its trainer pods (the highest seen), added to
    ``known``: a job whose trainers are all gone for a while keeps the one it had."""
    out = dict(known or {})
    for p in pods:
        if p.role == "trainer" and p.job is not None and p.priority > out.get(p.job, p.priority - 1):
            out[p.job] = p.priority
    return out


def with_priorities(demands: list[JobDemand] | tuple[JobDemand, ...], priorities: dict[str, int]) -> list[JobDemand]:
    """The demands with the priorities their trainer pods show (a demand's own may be unknown to its sidecar)."""
    return [replace(d, priority=priorities[d.name]) if priorities.get(d.name, d.priority) != d.priority else d
            for d in demands]


NO_SCHEDULE_EFFECTS = ("NoSchedule", "NoExecute")  # taints that keep new pods off a node


def may_run_on(d: JobDemand, n: Node) -> bool:
    """Whether ``d``'s trainer pods may be scheduled to ``n``: its selector matches the node's labels,
    and, when the job names tolerations (a pool of its own), every NoSchedule/NoExecute taint of the
    node is tolerated. A job that names none is not kept off tainted nodes here: such taints also
    hold nodes for a while (a drain, a test), and its trainers already there keep running."""
    labels = dict(n.labels)
    if any(labels.get(k) != v for k, v in d.node_selector):
        return False
    if not d.tolerations:
        return True
    return all(any(tk == k and tv in ("", v) and te in ("", e) for tk, tv, te in d.tolerations)
               for k, v, e in n.taints if e in NO_SCHEDULE_EFFECTS)


@dataclass(frozen=True)
class PodTotals:
    """Sums over a snapshot's live pods (``edl.api.ledger.PodLedger`` keeps them as pods change), so a
    decision reads the load per node instead of adding up every pod. Requests in exact units: CPU and
    GPU in thousandths, memory in bytes (``units``).

    Trainers (``role == "trainer"``) are kept per job, whatever their state; of the other live pods,
    those waiting for a node (pending, unbound) are listed, and the rest are summed per node."""

    load: dict[str, tuple[int, int, int]]  # node -> requests of the bound pods other than trainers
    requested: tuple[int, int, int]  # requests of the live pods other than trainers and waiting ones
    waiting: tuple[Pod, ...]  # pods other than trainers waiting for a node
    trainers: dict[str, tuple[Pod, ...]]  # job -> its live trainer pods
    shapes: frozenset[float]  # CPU requests of the jobs' other pods (not waiting)


def units(r: Resources) -> tuple[int, int, int]:
    """``r`` in exact integer units: thousandths of a CPU and of a GPU, bytes of memory."""
    return round(r.cpu * 1000), round(r.memory * 2 ** 30), round(r.gpu * 1000)


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[Node, ...]
    pods: tuple[Pod, ...]
    jobs: tuple[JobDemand, ...]
    now: float = 0.0
    totals: PodTotals | None = None  # ``pods`` summed, when the observer keeps the sums as pods change


class TrainerExit(str, Enum):
    """Why a trainer pod ended; decides relaunch, failure count or job failure."""

    SUCCEEDED = "succeeded"  # exit 0: drained, or the job is over
    PREEMPTED = "preempted"  # evicted or preempted (137 without OOMKilled, deleted by the scheduler)
    NODE_LOST = "node_lost"  # its node went away
    OOM_KILLED = "oom_killed"  # the memory limit is too small: retrying cannot help
    USER_ERROR = "user_error"  # exit 2: bad input, named in the message
    CANNOT_START = "cannot_start"  # its image cannot be pulled or its Secret key is missing: waiting cannot help
    FAILED = "failed"  # anything else: counts towards --max-trainer-failures


@dataclass(frozen=True)
class TrainerPod:
    name: str
    phase: PodPhase
    created_at: float  # seconds; the launcher counts pending time from when it first saw the pod, on its clock
    node: str | None = None
    exit: TrainerExit | None = None  # set once terminated, or CANNOT_START while it can never start
    message: str = ""  # for a terminated pod or one that cannot start: what happened, one line
    hint: str | None = None  # the node it was created to prefer (``Cluster.create_trainer``), if any


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
        """The master exists and has not terminated (it may still be starting). Raises
        ``UserError`` when it refused the job (exit 2) and ``PermanentError`` when it cannot start
        or keeps crashing, with its own reason: waiting for it cannot help."""
        ...

    def recreate_master(self) -> str:
        """Replace a lost master; it resumes from the job's last checkpoint. Returns the successor's
        address, which differs from the old one where the address is the master pod's own (pod-ip)."""
        ...

    def trainers(self) -> list[TrainerPod]:
        """Every trainer of the job that still exists, terminated ones included until deleted."""
        ...

    def create_trainer(self, name: str, node: str | None = None) -> None:
        """A new trainer; ``node``: the node it should prefer (the plan's), never one it must have:
        where that node has no room the scheduler places it elsewhere."""
        ...

    def delete_trainer(self, name: str) -> None:
        """Idempotent: deleting a trainer that is gone is fine."""
        ...

    def delete_job(self) -> None:
        """Every object of the job, gone. Idempotent."""
        ...

    def record(self, reason: str, message: str, warning: bool = False) -> None:
        """A significant event (Kubernetes Event on the launcher pod; a log line elsewhere)."""
        ...


class SizeCause(str, Enum):
    """Why a job is at the size it is: the kind of a ``SizeReason``."""

    AT_MAX = "at_max"  # it has every trainer it may have
    WAITING = "waiting"  # its minimum does not fit: it waits, as a pending pod does
    GROWING = "growing"  # the plan grows it into room that is free
    NOT_WORTH_PAUSE = "not_worth_pause"  # there is room, but the growth would not pay for its pause
    SHARED = "shared"  # the room there is goes to other jobs that gain more from it
    NO_ROOM = "no_room"  # the nodes it may run on are full
    HANDED_BACK = "handed_back"  # it gave trainers up to pods of a higher priority
    HELD_API_AWAY = "held_api_away"  # the sidecar holds the size: its view of the cluster is not current
    HELD_UNSCHEDULABLE = "held_unschedulable"  # trainers could not be scheduled lately: no growth for a while
    HELD_NO_PLAN = "held_no_plan"  # the namespace's deciding sidecar has not planned the job (yet)
    FIXED = "fixed"  # set by hand (``edl scale``), or no autoscaler runs


@dataclass(frozen=True)
class SizeReason:
    """Why a job is at its size, for a person: the kind, and one line with the numbers behind it."""

    cause: SizeCause
    text: str

    def to_json(self) -> dict[str, str]:
        return {"cause": self.cause.value, "text": self.text}

    @classmethod
    def from_json(cls, d: dict) -> SizeReason:
        return cls(SizeCause(d["cause"]), str(d["text"]))


@dataclass(frozen=True)
class PlanLine:
    """One job's line of a plan: what the sidecar that decides for a namespace tells each job's own."""

    size: int
    nodes: tuple[str, ...]  # where its trainers go (``Plan.nodes``, up to ``size``)
    reason: SizeReason
    at: float = 0.0  # when it was planned (the deciding sidecar's clock)


class ClusterView(Protocol):
    """What the sidecar reads and writes of the cluster; one implementation per backend.

    Where several jobs' sidecars share a view of one cluster (Kubernetes: a namespace), one of them
    decides for all (``lead``): it reads the nodes, pods and demands, plans every job and publishes
    each job's line (``publish_plan``); the others read their own line (``plan_line``). A backend
    where every sidecar decides for itself leads always and publishes nowhere.
    """

    def refresh(self, now: float) -> None:
        """Read what the view reads once a period, before ``healthy`` and ``lead`` (Kubernetes: who decides
        for the namespace, and every job's line); nothing where the view is kept current otherwise."""
        ...

    def healthy(self) -> bool:
        """The view is current (listed and watching); if not, the sidecar holds the size."""
        ...

    def nodes(self) -> list[Node]: ...

    def pods(self) -> list[Pod]: ...

    def totals(self) -> PodTotals | None:
        """The sums of the pods the last ``pods()`` returned, where the view keeps them (else ``None``)."""
        ...

    def peer_demands(self, now: float) -> list[JobDemand]:
        """Every live published demand, this job's included once published."""
        ...

    def publish(self, demand: JobDemand, now: float, reason: SizeReason | None = None) -> None:
        """Renew this job's demand, and why it is at its size (``None``: not decided yet)."""

    def lead(self, now: float) -> bool:
        """Whether this sidecar decides for every job of its view now (taking that over when nobody
        does), with the nodes, pods and demands read; ``False``: it follows its ``plan_line``."""
        ...

    def publish_plan(self, lines: dict[str, PlanLine], now: float) -> bool:
        """Every job's line of the plan the leading sidecar made; ``False`` when it no longer leads."""
        ...

    def plan_line(self, job: str, now: float) -> PlanLine | None:
        """This job's line of the leading sidecar's latest plan (``None``: none, or too old)."""
        ...


class DecidesAlone:
    """For a ``ClusterView`` whose sidecars each decide for themselves (the same deterministic policy over
    the same snapshot gives every one the same plan): it always leads and publishes no plan."""

    def refresh(self, now: float) -> None:
        pass

    def lead(self, now: float) -> bool:
        return True

    def publish_plan(self, lines: dict[str, PlanLine], now: float) -> bool:
        return True

    def plan_line(self, job: str, now: float) -> PlanLine | None:
        return None


# ------------------------------------------------------------ the demand, as text
def encode_demand(d: JobDemand) -> str:
    body = asdict(d)
    body["trainer"] = asdict(d.trainer)
    body["throughput"] = [round(x, 3) for x in d.throughput]
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def decode_demand(text: str) -> JobDemand:
    """The inverse of ``encode_demand``; raises ``ValueError`` on anything malformed."""
    try:
        b = json.loads(text)
        d = JobDemand(name=str(b["name"]), min=int(b["min"]), max=int(b["max"]), current=int(b["current"]),
                      trainer=Resources(float(b["trainer"]["cpu"]), float(b["trainer"]["memory"]),
                                        float(b["trainer"]["gpu"])),
                      priority=int(b.get("priority", 0)),
                      throughput=tuple(float(x) for x in b.get("throughput") or ()),
                      rescale_cost_s=float(b.get("rescale_cost_s") or 0.0),
                      remaining=None if b.get("remaining") is None else float(b["remaining"]),
                      node_selector=tuple((str(k), str(v)) for k, v in b.get("node_selector") or ()),
                      tolerations=tuple((str(k), str(v), str(e)) for k, v, e in b.get("tolerations") or ()))
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"malformed demand: {e}") from e
    if not 0 <= d.min <= d.max or d.current < 0:
        raise ValueError(f"malformed demand: min {d.min}, max {d.max}, current {d.current}")
    return d
