"""The master's API as its clients see it: the states it names, what it answers, and the two links.

``ControlLink`` is what the launcher, the autoscale sidecar and the CLI ask of a job's master;
``TrainerLink`` is what a trainer asks. ``edl.masterlink.HttpMaster`` implements both over
HTTP+JSON; the simulator's ``SimMaster`` implements ``ControlLink`` over its job model. Every
answer is a frozen dataclass with its one JSON form (``to_json`` here, ``from_json`` on the class),
which the master's server writes and the HTTP client reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from typing import Any, Protocol

from edl.api.cluster import SizeReason
from edl.api.data import Cursor, CursorJSON, Task, cursor_from_json, cursor_to_json
from edl.api.spec import JobSpec


# ------------------------------------------------------------------ the states the master names
class JobStatus(str, Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Phase(str, Enum):
    """The membership's phase (see ``edl.master.membership``)."""

    FORMING = "forming"  # no generation yet: waiting for the first trainers
    RUNNING = "running"
    SYNCING = "syncing"  # a change is pending; members are reporting their last step


class TrainerState(str, Enum):
    WAITING = "waiting"
    ACTIVE = "active"
    DRAINING = "draining"
    LEFT = "left"
    FAILED = "failed"

    @property
    def gone(self) -> bool:
        """Out of the job for good: drained, or failed."""
        return self in (TrainerState.LEFT, TrainerState.FAILED)


class Reason(str, Enum):
    """Why a generation was formed."""

    START = "start"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    FAILURE = "failure"
    RESUME = "resume"


class Source(str, Enum):
    """Where the model state of a new generation comes from."""

    PEER = "peer"  # rank 0's replica, broadcast
    CHECKPOINT = "checkpoint"  # loaded by rank 0 from the committed checkpoint
    INIT = "init"  # freshly initialised (no checkpoint yet)


class Next(Enum):
    """What asking for the next task answers besides a task."""

    WAIT = "wait"  # nothing to hand out now; held tasks may still come back
    FINISHED = "finished"  # every epoch is done


class Unassigned(str, Enum):
    """Why asking for an assignment answered without one."""

    WAIT = "wait"  # no newer generation yet (the long poll ended): ask again
    FINISHED = "finished"  # the job is over (``NoAssignment.job_status`` says how)
    UNKNOWN = "unknown"  # the master does not know this trainer (it restarted): register again
    LEFT = "left"  # drained: leave
    FAILED = "failed"  # dropped from the job: leave
    ABANDONED = "abandoned"  # the launcher went silent (``edl.master.deadman``): leave, exit 0


# At start a master waits this long for its desired trainers to register before it forms the first
# generation with fewer (``edl.master.membership``); the simulator's jobs wait as long (``edl.sim.engine``).
START_GRACE_S = 20.0
# A trainer told to stop is replaced at the sidecar's next decision, or after this long without one (three
# of its default periods: the sidecar is away, or decides less often than that).
REPLACEMENT_HOLD_S = 30.0


# ------------------------------------------------------------------ the one JSON form
_PLAIN = frozenset({int, float, str, bool})


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def to_json(value: Any) -> Any:
    """The JSON form of any answer below: enums by value, cursors as ``[task_id, offset]``,
    dataclasses as objects of their fields, tuples as lists."""
    if value is None or type(value) in _PLAIN:
        # Most values are plain (a status holds one count per epoch: a thousand for ``--epochs 1000``);
        # the checks below cost microseconds each, which the launcher's polls paid per value.
        return value
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Cursor):
        return cursor_to_json(value)
    if is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES.get(type(value))
        if names is None:  # ``fields`` builds its answer at every call: a status holds a thousand dataclasses
            names = _FIELD_NAMES[type(value)] = tuple(f.name for f in fields(value))
        return {name: to_json(getattr(value, name)) for name in names}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def task_from_json(d: dict) -> Task:
    return Task(**d)


# ------------------------------------------------------------------ GET /v1/status
@dataclass(frozen=True)
class BudgetView:
    """One of the launcher's failure budgets (``edl.launcher.budget``), as it last told the master: the
    failures since the job's last progress (``spent``, the job fails past ``limit``), over its life, and
    those that progress or time forgave."""

    spent: int
    limit: int
    total: int
    refunded: int

    def describe(self) -> str:
        """``3 of 10 without progress (12 in all, 9 forgiven)``."""
        return f"{self.spent} of {self.limit} without progress ({self.total} in all, {self.refunded} forgiven)"

    @classmethod
    def from_json(cls, d: dict) -> BudgetView:
        return cls(spent=int(d["spent"]), limit=int(d["limit"]), total=int(d["total"]), refunded=int(d["refunded"]))


def trainer_number(trainer_id: str) -> int:
    """The number ending a trainer's id (``job-t12``: 12), as launchers number them; 0 for none."""
    digits = len(trainer_id) - len(trainer_id.rstrip("0123456789"))
    return int(trainer_id[-digits:]) if digits else 0


@dataclass(frozen=True)
class TrainerView:
    """One trainer of the job (those still in it: not left, not failed)."""

    id: str
    rank: int | None  # in the current generation; None while waiting to join
    pid: int
    state: TrainerState
    step: int

    @classmethod
    def from_json(cls, d: dict) -> TrainerView:
        return cls(d["id"], d["rank"], d["pid"], TrainerState(d["state"]), d["step"])


@dataclass(frozen=True)
class GenerationSummary:
    """One generation the job formed (across master restarts: ``id`` counts them all)."""

    id: int
    master_generation: int  # the id the current master gave it
    world_size: int
    members: tuple[str, ...]  # in rank order
    reason: Reason
    source: Source
    base_step: int
    pause_s: float | None  # from the change's trigger to the first step; None until then
    triggered_at: float
    first_step_at: float | None
    rolled_back_steps: int
    # A graceful change switched into without a stop: how long it was prepared while the one before
    # trained (None: formed after a stop at a step boundary)
    prepared_s: float | None = None
    stopped_at: float | None = None  # the generation before stopped stepping (None: the first)
    formed_at: float | None = None  # the master formed it (members, rank 0, base step)
    cause: str = ""  # what began the change, as the master heard of it ("edl-x-trainer-3 joined")
    # ``triggered_at`` on the wall clock (``time.time()``); the other times are on the master's own clock,
    # which only their differences mean anything on.
    wall_at: float | None = None

    @classmethod
    def from_json(cls, d: dict) -> GenerationSummary:
        return cls(d["id"], d["master_generation"], d["world_size"], tuple(d["members"]), Reason(d["reason"]),
                   Source(d["source"]), d["base_step"], d["pause_s"], d["triggered_at"], d["first_step_at"],
                   d["rolled_back_steps"], d.get("prepared_s"), d.get("stopped_at"), d.get("formed_at"),
                   d.get("cause", ""), d.get("wall_at"))

    def chain(self) -> dict[str, float]:
        """Where the change's time went, in seconds after the master heard of it: ``stopped`` (the
        generation before stopped stepping: none for a graceful switch, whose members switch without
        a stop), ``formed`` and ``first_step``; those not reached yet are missing."""
        out: dict[str, float] = {}
        for name, at in (("stopped", self.stopped_at), ("formed", self.formed_at), ("first_step", self.first_step_at)):
            if at is not None:
                out[name] = round(max(0.0, at - self.triggered_at), 3)
        return out

    def describe(self) -> str:
        """One line: the generation, what began it and its chain (``edl status``, the launcher's Event)."""
        steps = ", ".join(f"{name.replace('_', ' ')} +{s:.2f} s" for name, s in self.chain().items())
        prepared = "" if self.prepared_s is None else f" (prepared for {self.prepared_s:.2f} s while training)"
        return (f"generation {self.id} ({self.reason.value}, {self.world_size} trainers): "
                f"{self.cause or 'cause not recorded'}; {steps or 'forming'}{prepared}")


@dataclass(frozen=True)
class CheckpointRecord:
    """One committed checkpoint."""

    step: int
    uri: str
    write_s: float
    generation: int

    @classmethod
    def from_json(cls, d: dict) -> CheckpointRecord:
        return cls(**d)


@dataclass(frozen=True)
class JobView:
    """The job as the master sees it now (``GET /v1/status``)."""

    job: str
    status: JobStatus
    error: str | None  # why the job failed
    master_uid: str  # changes when the master restarts
    phase: Phase
    generation: int  # the current generation's id (0: none yet)
    world_size: int
    desired_trainers: int
    unschedulable_at: float | None  # when the launcher last reported trainers it could not place
    min_trainers: int
    max_trainers: int
    epoch: int  # the oldest epoch not yet done
    epochs: int
    epochs_completed: int
    rows_per_epoch: int
    done_rows: tuple[int, ...]  # rows committed, per epoch
    step: int  # the last completed training step the master saw
    loss: float | None  # the latest step's mean training loss
    trainers: tuple[TrainerView, ...]
    generations: tuple[GenerationSummary, ...]
    checkpoints: tuple[CheckpointRecord, ...]
    elapsed_s: float
    abandoned: bool = False  # the launcher went silent: the master is ending the job (``edl.master.deadman``)
    # Where the sidecar's plan puts the job's trainers, one node per trainer (``edl.api.policy.Plan``):
    # the launcher gives new trainer pods the ones no trainer has yet as their preferred node.
    node_hints: tuple[str, ...] = ()
    # Trainers told to stop (preempted, deleted) whose replacements wait for the sidecar's next decision, by
    # id: the launcher does not fill the places of those whose pods are gone (``plan_trainers``).
    held_replacements: tuple[str, ...] = ()
    # Trainers told to stop while the job is at its minimum, by id: each trains on until a replacement has
    # joined, then leaves as a drained one does; the launcher starts the replacements and counts them out.
    replacing: tuple[str, ...] = ()
    user_error: bool = False  # failed because of the user's input (``error`` names it): a retry cannot help
    # Counts the changes of what the launcher acts on (``Job.control_key``) this master has answered with:
    # ``GET /v1/status?after=`` this and ``wait_s`` answers once it has moved on, or after ``wait_s`` (a long
    # poll). It only grows, so of two answers of one master the one with the higher count is the newer. 0:
    # a master that does not count.
    control_version: int = 0
    # Why the job is at its size: the autoscale sidecar's latest reason, or the master's own (set by hand,
    # trainers that could not be scheduled); ``None`` while nobody has said.
    reason: SizeReason | None = None
    # The launcher's failure budgets by kind (``master_restarts``, ``trainer_failures``), from its latest
    # beat; empty before it sent one.
    budgets: dict[str, BudgetView] = field(default_factory=dict)
    # The highest number ending the id of any trainer this master has registered, those gone included (its
    # books refuse an id back): a launcher that adopts the job numbers its new trainers after it.
    highest_trainer_number: int = 0
    # Trainers that left the job (drained, switched out) whose exits the launcher has not reported yet, by id:
    # a launcher that adopts the job counts them as leaving (their processes or pods may still be ending).
    departing: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, d: dict) -> JobView:
        return cls(
            job=d["job"], status=JobStatus(d["status"]), error=d["error"], master_uid=d["master_uid"],
            phase=Phase(d["phase"]), generation=d["generation"], world_size=d["world_size"],
            desired_trainers=d["desired_trainers"], unschedulable_at=d["unschedulable_at"],
            min_trainers=d["min_trainers"], max_trainers=d["max_trainers"], epoch=d["epoch"], epochs=d["epochs"],
            epochs_completed=d["epochs_completed"], rows_per_epoch=d["rows_per_epoch"],
            done_rows=tuple(d["done_rows"]), step=d["step"], loss=d["loss"],
            trainers=tuple(TrainerView.from_json(t) for t in d["trainers"]),
            generations=tuple(GenerationSummary.from_json(g) for g in d["generations"]),
            checkpoints=tuple(CheckpointRecord.from_json(c) for c in d["checkpoints"]),
            elapsed_s=d["elapsed_s"], abandoned=d.get("abandoned", False), user_error=d.get("user_error", False),
            node_hints=tuple(d.get("node_hints") or ()), held_replacements=tuple(d.get("held_replacements") or ()),
            replacing=tuple(d.get("replacing") or ()), control_version=d.get("control_version", 0),
            reason=SizeReason.from_json(d["reason"]) if d.get("reason") else None,
            budgets={k: BudgetView.from_json(v) for k, v in (d.get("budgets") or {}).items()},
            highest_trainer_number=d.get("highest_trainer_number", 0),
            departing=tuple(d.get("departing") or ()),
        )


# ------------------------------------------------------------------ a trainer's answers
@dataclass(frozen=True)
class Registration:
    """What registering answers."""

    master_uid: str
    job_status: JobStatus

    @classmethod
    def from_json(cls, d: dict) -> Registration:
        return cls(d["master_uid"], JobStatus(d["job_status"]))


@dataclass(frozen=True)
class Prepared:
    """The next generation of a graceful change, announced while the current one trains on.

    Its members form its collective in the background and tell the master (``prepared_ready``);
    once all have, the master gives the ``go``, and the current generation's members switch into it
    at the first step at which every one of them has the go (the step's slots say so): no stop, no
    report to wait on, no group to form. Members of the current generation not in ``members`` leave
    there. Its base step is that step, known to every member from the slots.
    """

    generation: int
    members: tuple[str, ...]  # in rank order: the current generation's that stay, then the joiners
    rendezvous: tuple[str, int]  # rank 0's collective store for it
    state_to: tuple[int, ...]  # the ranks that take rank 0's state at the switch (the joiners)
    go: bool  # every member formed its collective: switch at the next step all have the go

    @classmethod
    def from_json(cls, d: dict) -> Prepared:
        host, port = d["rendezvous"]
        return cls(int(d["generation"]), tuple(d["members"]), (str(host), int(port)), tuple(d["state_to"]),
                   bool(d["go"]))


@dataclass(frozen=True)
class HeartbeatAnswer:
    master_uid: str
    known: bool  # the master knows this trainer (False: it restarted and lost it)
    state: TrainerState | None
    generation: int  # the current generation's id
    stop: bool  # stop at the next step boundary (a change is pending, or the job is over)
    job_status: JobStatus
    checkpoint: bool  # a checkpoint was asked for: rank 0 takes one at the next step
    abandoned: bool = False  # the launcher went silent: stop, then leave (``Unassigned.ABANDONED``)
    # This trainer's cursor in the newest committed checkpoint of ``generation``: what its task ledger
    # (``ResumeReport``) may forget up to. None: no checkpoint of this generation has committed.
    committed_cursor: Cursor | None = None
    # A member of ``abort_through`` (or of an older generation) failed: its collective can no longer
    # complete, so leave it now (do not wait for it) and report the last completed step. Also said of
    # a prepared generation the master dropped after members had switched into it.
    abort: bool = False
    abort_through: int = 0
    prepared: Prepared | None = None  # the next generation, for its members and the current one's

    @classmethod
    def from_json(cls, d: dict) -> HeartbeatAnswer:
        state = None if d["state"] is None else TrainerState(d["state"])
        prepared = None if d["prepared"] is None else Prepared.from_json(d["prepared"])
        return cls(d["master_uid"], d["known"], state, d["generation"], d["stop"], JobStatus(d["job_status"]),
                   d["checkpoint"], d["abandoned"], cursor_from_json(d["committed_cursor"]), d["abort"],
                   d["abort_through"], prepared)


@dataclass(frozen=True)
class Assignment:
    """What one trainer needs to join a generation."""

    generation: int
    rank: int
    world_size: int
    members: tuple[str, ...]  # in rank order
    rendezvous: tuple[str, int]  # rank 0's collective store
    base_step: int
    source: Source
    checkpoint_uri: str | None  # with ``Source.CHECKPOINT``
    cursor: Cursor | None  # this trainer's data position at ``base_step``
    held: tuple[Task, ...]  # the tasks it holds, in the order it consumes them
    held_offset: int  # rows consumed of ``held[0]``
    master_uid: str
    state_to: tuple[int, ...] = ()  # the ranks that take rank 0's state (none: every member holds it)


@dataclass(frozen=True)
class NoAssignment:
    why: Unassigned
    job_status: JobStatus | None = None  # with ``Unassigned.FINISHED``
    master_uid: str | None = None  # with ``Unassigned.UNKNOWN``


def assignment_to_json(answer: Assignment | Prepared | NoAssignment) -> dict:
    if isinstance(answer, Assignment):
        return {**to_json(answer), "status": "assigned"}
    if isinstance(answer, Prepared):  # a joiner's: form its collective, then wait for the go
        return {**to_json(answer), "status": "prepared"}
    out: dict[str, Any] = {"status": answer.why.value}
    if answer.job_status is not None:
        out["job_status"] = answer.job_status.value
    if answer.master_uid is not None:
        out["master_uid"] = answer.master_uid
    return out


def assignment_from_json(d: dict) -> Assignment | Prepared | NoAssignment:
    if d["status"] == "prepared":
        return Prepared.from_json(d)
    if d["status"] != "assigned":
        job_status = d.get("job_status")
        return NoAssignment(Unassigned(d["status"]), None if job_status is None else JobStatus(job_status),
                            d.get("master_uid"))
    host, port = d["rendezvous"]
    return Assignment(d["generation"], d["rank"], d["world_size"], tuple(d["members"]), (host, int(port)),
                      d["base_step"], Source(d["source"]), d["checkpoint_uri"], cursor_from_json(d["cursor"]),
                      tuple(task_from_json(t) for t in d["held"]), d["held_offset"], d["master_uid"],
                      tuple(d["state_to"]))


def next_task_to_json(answer: Task | Next) -> dict:
    if isinstance(answer, Next):
        return {"status": answer.value}
    return {"status": "task", "task": to_json(answer)}


def next_task_from_json(d: dict) -> Task | Next:
    return task_from_json(d["task"]) if d["status"] == "task" else Next(d["status"])


# A failed report's step when the trainer holds none of its generation's state: the generation did
# not form before its state reached the trainer (a checkpoint to load, rank 0's state to receive), so
# its replica is whatever it held before, no source for the next generation.
NO_STATE = -1


@dataclass(frozen=True)
class SyncReport:
    """A member's last completed step in its generation and everyone's cursor there (``NO_STATE``: see there)."""

    trainer: str
    generation: int
    step: int
    cursors: dict[str, Cursor | None]
    store_port: int  # where this trainer's collective store listens in the next generation
    failed: bool = False  # the step after ``step`` raised (a peer died)
    switched_to: int = 0  # the prepared generation it went on into at ``step`` (0: none, it waits)


@dataclass(frozen=True)
class ResumeReport:
    """What a trainer carries into its registration with a restarted master: where it stopped, so that
    the new master can go on from there instead of rolling back to the checkpoint (``edl.master.resume``).

    ``ledger`` is every task this trainer took into its buffer since ``ledger_start`` (its cursor where
    the ledger begins: its generation's start, or the newest committed checkpoint of the generation),
    in the order it consumes them; ``ledger_offset`` rows of ``ledger[0]`` were consumed before that.
    With every member's ledger and cursors the master knows every row consumed since the checkpoint.
    """

    master_uid: str  # the master of the generation it stopped in
    generation: int
    base_step: int  # where that generation started, and from what
    source: Source
    checkpoint_uri: str | None  # with ``Source.CHECKPOINT``
    step: int  # the last step it completed (its replica's step)
    members: tuple[str, ...]  # that generation's members, in rank order
    cursors: dict[str, Cursor | None]  # every member's cursor at ``step``
    ledger: tuple[Task, ...]
    ledger_start: Cursor | None
    ledger_offset: int

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, d: dict) -> ResumeReport:
        return cls(str(d["master_uid"]), int(d["generation"]), int(d["base_step"]), Source(d["source"]),
                   d["checkpoint_uri"], int(d["step"]), tuple(d["members"]), cursors_from_json(d["cursors"]),
                   tuple(task_from_json(t) for t in d["ledger"]), cursor_from_json(d["ledger_start"]),
                   int(d["ledger_offset"]))


@dataclass(frozen=True)
class UserCodeFailure:
    """A trainer's report: the user's code raised (``edl.errors.UserCodeError``); the trainer exits."""

    trainer: str
    step: int  # the training step it was computing; 0: before the first (building, warming up)
    part: str  # which of the user's calls raised, in words ("loss()", "the model's forward")
    fingerprint: str  # the exception's type and the first line of its message
    log: str  # where the full traceback is: the trainer's log file, or how to read it (``kubectl logs``)
    rows: tuple[tuple[str, int, int], ...] = ()  # the step's batch: (shard, first row, end row) per slice

    @classmethod
    def from_json(cls, d: dict) -> UserCodeFailure:
        return cls(d["trainer"], d["step"], d["part"], d["fingerprint"], d["log"],
                   tuple((str(s), int(a), int(b)) for s, a, b in d.get("rows", ())))


def cursors_to_json(cursors: dict[str, Cursor | None]) -> dict[str, CursorJSON]:
    return {k: cursor_to_json(c) for k, c in cursors.items()}


def cursors_from_json(cursors: dict[str, CursorJSON]) -> dict[str, Cursor | None]:
    return {k: cursor_from_json(c) for k, c in cursors.items()}


# ------------------------------------------------------------------ the links
class SizeLink(Protocol):
    """What the autoscale sidecar asks of a job's master: its status, and the size it decided
    (``ControlLink.status`` and ``ControlLink.scale``)."""

    def status(self) -> JobView | None: ...

    def scale(self, trainers: int, nodes: tuple[str, ...] = (), reason: SizeReason | None = None,
              released: tuple[str, ...] | None = None) -> int: ...


class ControlLink(Protocol):
    """What the launcher, the sidecar and the CLI ask of a job's master.

    ``healthy``, ``status`` and ``summary`` are polled: they answer ``False``/``None`` while the
    master cannot be reached. The others raise ``TemporaryError`` then; a refused request raises
    ``UserError`` (with the master's reason).
    """

    def healthy(self) -> bool:
        """The master answers (no token needed)."""
        ...

    def status(self) -> JobView | None: ...

    def summary(self) -> dict[str, Any] | None:
        """The run summary, a JSON document that launchers extend and write as is."""
        ...

    def scale(self, trainers: int, nodes: tuple[str, ...] = (), reason: SizeReason | None = None,
              released: tuple[str, ...] | None = None) -> int:
        """Set the desired trainer count, where the trainers should go (``JobView.node_hints``; empty:
        anywhere) and why (``JobView.reason``; ``None``: set by hand); answers the count. Outside the job's
        min..max: ``UserError``. ``released``: the held trainers (``JobView.held_replacements``) the decision
        saw, now replaced if the count still asks for them; ``None``: every held trainer."""
        ...

    def report_unschedulable(self, count: int) -> int:
        """``count`` trainer pods could not be placed; answers the lowered desired count."""
        ...

    def report_exit(self, trainer: str, code: int, preempted: bool = False) -> None:
        """``trainer``'s process ended with ``code``; ``preempted``: its pod was preempted (the master holds
        the place of one that never joined a generation for the sidecar's next decision)."""
        ...

    def drain(self, trainer: str) -> bool:
        """Ask a trainer to leave at the next step boundary. ``False``: the master does not know it."""
        ...

    def request_checkpoint(self) -> None:
        """Have rank 0 take a checkpoint at its next step."""
        ...

    def fail_job(self, message: str, user: bool = False) -> None:
        """Fail the job; ``user``: because of the user's input (the launcher exits 2)."""
        ...

    def shutdown(self) -> None: ...

    def launcher_beat(self, budgets: dict[str, BudgetView] | None = None) -> None:
        """The job's launcher is alive (its dead-man switch, ``edl.master.deadman``): once a poll. With its
        failure budgets as they stand, for the status to show."""
        ...


class TrainerLink(Protocol):
    """What a trainer asks of its master. Raises ``TemporaryError`` while the master cannot be
    reached (after the link's give-up time), ``StaleError`` when a request names a generation that
    is no longer current, ``UserError`` when the master refuses a request."""

    def spec(self) -> JobSpec: ...

    def register(self, trainer: str, pid: int, host: str, store_port: int,
                 resume: ResumeReport | None = None) -> Registration:
        """Join the job; ``resume``: where this trainer stopped under the master that restarted."""
        ...

    def assignment(self, trainer: str, after: int, wait_s: float) -> Assignment | Prepared | NoAssignment:
        """Long poll (up to ``wait_s``) for a generation newer than ``after`` (a waiting trainer may get
        the prepared one it is to join)."""
        ...

    def heartbeat(self, trainer: str, *, generation: int, step: int, safe_cursor: Cursor | None,
                  loss: float | None, wait_s: float, in_collective_s: float | None = None,
                  store_port: int | None = None, heard: tuple[int, bool] = (0, False)) -> HeartbeatAnswer:
        """Renew the lease and commit ``safe_cursor``; waits up to ``wait_s`` for a reason to stop or news
        of the prepared generation (``heard``: the one the trainer knows of and whether it had the go).
        ``in_collective_s``: how long the trainer has been waiting in its generation's collective (None: it
        is not in one), from which the master tells who the others wait on; ``store_port``: where its
        collective store would listen in the next generation."""
        ...

    def prepared_ready(self, trainer: str, generation: int) -> None:
        """The trainer formed the prepared ``generation``'s collective."""
        ...

    def leave(self, trainer: str) -> None:
        """The trainer was told to stop (SIGTERM: its pod deleted, preempted or evicted): drain it, so that
        it leaves at the next change as a drained trainer does and its peers never wait for it."""
        ...

    def next_task(self, trainer: str, request_id: str, safe_cursor: Cursor | None, *, master_uid: str | None = None,
                  generation: int | None = None) -> Task | Next:
        """The next task to prefetch; the same ``request_id`` gets the same answer again. With ``master_uid``
        and ``generation`` (the trainer's tasks are for that generation of that master), only in that
        generation: ``Next.WAIT`` in any other."""
        ...

    def task_failed(self, trainer: str, task_id: int, reason: str) -> None: ...

    def sync(self, report: SyncReport) -> None: ...

    def first_step(self, trainer: str, generation: int) -> None:
        """Rank 0 completed the generation's first step: the pause of the change ends."""
        ...

    def checkpoint_cut(self, generation: int, step: int, cursors: dict[str, Cursor | None]) -> dict[str, Any]:
        """The master's half of a consistent cut at ``step`` (its queue, as ``master.json``)."""
        ...

    def checkpoint_committed(self, generation: int, step: int, uri: str, write_s: float) -> bool:
        """``False``: no such cut is pending (a newer one committed first)."""
        ...

    def finish(self, step: int, final_model_uri: str | None, metrics: dict[str, float]) -> None: ...

    def user_code_failed(self, failure: UserCodeFailure) -> str | None:
        """Report that the user's code raised; answers the job's error when the master judged it the
        user's fault and failed the job (``edl.master.usercode``): a relaunch cannot help."""
        ...

    def fail_job(self, message: str, user: bool = False) -> None:
        """Fail the job; ``user``: because of the user's input (the launcher exits 2)."""
        ...
