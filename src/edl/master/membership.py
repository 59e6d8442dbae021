"""Trainer membership and generations, as a pure state machine (clock injected).

A *generation* is one stable membership: a world size, a rank map and a
rendezvous address. Any change (a trainer registers, one is drained, one dies,
the master restarted) starts a new one:

    RUNNING --change--> SYNCING --all members reported or declared gone--> RUNNING (g+1)

While SYNCING, the members of the old generation finish the step they are in,
agree on a common last step through the all-reduce itself, and report it with
every rank's data cursor at that step. The master then forms the next
generation from the survivors and the waiting joiners; the survivor with the
highest completed step becomes rank 0 and the source of model state.

The phase moves only through ``PHASE_TRANSITIONS``::

    FORMING (no generation yet) -> RUNNING -> SYNCING -> RUNNING ...

Trainer states and their transitions (``TRAINER_TRANSITIONS``)::

    WAITING  (registered, not yet in a generation) -> ACTIVE
    ACTIVE   -> DRAINING (asked to leave) -> LEFT
    ACTIVE | DRAINING | WAITING -> FAILED (died, lease expired, missed the sync, or held the others up)

A failure aborts the generation: every member that has not reported yet is told (in its
heartbeat answer) to leave the collective now rather than wait for it, since a collective
with a dead member never completes. A member the others wait on in the collective while it
is silent, or alive but not stepping (``holding_up``), is declared failed, which aborts the
generation for the others: they go on from their last common step with their own state.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from edl.api.data import Cursor
from edl.api.master import Phase, Reason, Source, SyncReport, TrainerState
from edl.master.transitions import Transitions

PHASE_TRANSITIONS = Transitions("membership phase", {
    Phase.FORMING: {Phase.RUNNING},
    Phase.RUNNING: {Phase.SYNCING},
    Phase.SYNCING: {Phase.RUNNING},
})

TRAINER_TRANSITIONS = Transitions("trainer state", {
    TrainerState.WAITING: {TrainerState.ACTIVE, TrainerState.FAILED, TrainerState.LEFT},
    TrainerState.ACTIVE: {TrainerState.DRAINING, TrainerState.FAILED, TrainerState.LEFT},
    TrainerState.DRAINING: {TrainerState.LEFT, TrainerState.FAILED},
    TrainerState.LEFT: set(),
    TrainerState.FAILED: set(),
})


@dataclass
class Trainer:
    id: str
    pid: int
    host: str
    store_port: int
    registered_at: float
    last_seen: float
    state: TrainerState = TrainerState.WAITING
    step: int = 0
    step_at: float | None = None  # when ``step`` last advanced (None: not since it registered)
    generation: int = 0  # the generation its last heartbeat was in
    waiting_since: float | None = None  # waiting in that generation's collective since (master's clock)

    def move(self, to: TrainerState) -> None:
        if to is not self.state:
            self.state = TRAINER_TRANSITIONS.move(self.state, to)


@dataclass
class Generation:
    id: int
    members: tuple[str, ...]  # in rank order
    rendezvous: tuple[str, int]
    base_step: int
    source: Source
    reason: Reason
    triggered_at: float
    formed_at: float
    cursors: dict[str, Cursor | None] = field(default_factory=dict)
    first_step_at: float | None = None
    rolled_back_steps: int = 0
    # The ranks that take rank 0's state at the start (none: every member already holds the base
    # step's state, as survivors of one generation stopped at the same step do).
    state_to: tuple[int, ...] = ()

    @property
    def world_size(self) -> int:
        return len(self.members)

    @property
    def pause_s(self) -> float | None:
        if self.first_step_at is None:
            return None
        return max(0.0, self.first_step_at - self.triggered_at)

    def rank_of(self, trainer: str) -> int | None:
        try:
            return self.members.index(trainer)
        except ValueError:
            return None


@dataclass(frozen=True)
class Formation:
    """What forming a generation decided, for the job to apply to its queue."""

    generation: Generation
    departed: dict[str, bool]  # trainer -> failed? ; they leave with their cursor at base
    rollback: bool  # no survivor holds state: restore queue and model from the checkpoint


def holding_up(members: Sequence[Trainer], generation: int, now: float, *, hang_s: float, silent_s: float,
               stall_s: float) -> list[tuple[str, str]]:
    """The members of ``generation`` that the others wait on in its collective, with why.

    A member holds the others up when someone who is still heartbeating has waited in the
    collective for over ``hang_s`` while the member has been silent for over ``silent_s`` (a
    stopped process, a frozen node: its lease has not run out yet), or when someone has waited
    over ``stall_s`` while the member is heartbeating but has neither stepped for ``stall_s``
    nor entered the collective (its training thread is stuck, in a read for example).
    """
    def silent(t: Trainer) -> bool:
        return now - t.last_seen > silent_s

    waited = [now - t.waiting_since for t in members
              if t.generation == generation and t.waiting_since is not None and not silent(t)]
    longest = max(waited, default=0.0)
    out: list[tuple[str, str]] = []
    for t in members:
        if silent(t):
            if longest > hang_s:
                out.append((t.id, f"silent for {now - t.last_seen:.1f} s while the others waited on it"))
        elif t.waiting_since is None or t.generation != generation:
            idle = now - (t.step_at if t.step_at is not None else t.registered_at)
            if longest > stall_s and idle > stall_s:
                out.append((t.id, f"no step for {idle:.1f} s while the others waited on it"))
    return out


START_GRACE_S = 20.0  # also what the simulator's jobs wait at start (edl.sim.engine)


@dataclass
class MembershipConfig:
    min_trainers: int
    max_trainers: int
    desired: int
    start_grace_s: float = START_GRACE_S  # at start, wait this long for ``desired`` registrations
    lease_s: float = 10.0  # a trainer silent this long is declared failed
    sync_timeout_s: float = 15.0  # a live member that does not report by then is dropped
    # ``holding_up``: the others waited this long on a member silent for ``silent_s``, or on one
    # heartbeating without stepping for ``stall_s``: it is dropped (well before its lease runs out).
    hang_s: float = 5.0
    silent_s: float = 4.0
    stall_s: float = 15.0


class Membership:
    """Registrations, heartbeats, drains, failures -> generations."""

    def __init__(self, config: MembershipConfig, first_generation: int = 1) -> None:
        self.config = config
        self.trainers: dict[str, Trainer] = {}
        self.phase = Phase.FORMING
        self.current: Generation | None = None
        self.history: list[Generation] = []
        self.next_generation = first_generation
        self.pending_reason: Reason | None = None
        self.pending_since: float | None = None
        self.reports: dict[str, SyncReport] = {}
        self.first_registration_at: float | None = None
        self.resume_reason = Reason.START
        self.excluded: list[tuple[str, str]] = []  # (trainer, why) dropped for holding the others up, in order

    # ---------------------------------------------------------------- helpers
    def _move(self, to: Phase) -> None:
        self.phase = PHASE_TRANSITIONS.move(self.phase, to)

    def _trigger(self, reason: Reason, now: float) -> None:
        if self.phase is Phase.RUNNING:
            self._move(Phase.SYNCING)
            self.pending_reason = reason
            self.pending_since = now
            self.reports = {}
        elif self.phase is Phase.SYNCING and reason is Reason.FAILURE:
            # A failure during a graceful change is still a failure.
            self.pending_reason = reason

    def members(self) -> tuple[str, ...]:
        return self.current.members if self.current else ()

    def waiting(self) -> list[Trainer]:
        return sorted(
            (t for t in self.trainers.values() if t.state is TrainerState.WAITING),
            key=lambda t: t.registered_at,
        )

    # ------------------------------------------------------------- transitions
    def register(self, trainer_id: str, pid: int, host: str, store_port: int, now: float) -> Trainer:
        if trainer_id in self.trainers:
            raise ValueError(f"trainer {trainer_id} is already registered")
        t = Trainer(trainer_id, pid, host, store_port, now, now)
        self.trainers[trainer_id] = t
        if self.first_registration_at is None:
            self.first_registration_at = now
        self._trigger(Reason.SCALE_UP, now)
        return t

    def heartbeat(self, trainer_id: str, step: int, now: float, generation: int | None = None,
                  in_collective_s: float | None = None) -> Trainer | None:
        """``generation`` and ``in_collective_s`` (None: not in a collective) say where the trainer's loop
        is; without ``generation`` (a repeated beat of the same request) they stay as they were."""
        t = self.trainers.get(trainer_id)
        if t is None:
            return None
        t.last_seen = now
        if step > t.step or t.step_at is None:
            t.step_at = now
        t.step = max(t.step, step)
        if generation is not None:
            t.generation = generation
            t.waiting_since = None if in_collective_s is None else now - max(0.0, in_collective_s)
        return t

    def drain(self, trainer_id: str, now: float) -> None:
        t = self.trainers[trainer_id]
        if t.state is TrainerState.WAITING:
            t.move(TrainerState.LEFT)
            return
        if t.state is not TrainerState.ACTIVE:
            return
        t.move(TrainerState.DRAINING)
        self._trigger(Reason.SCALE_DOWN, now)

    def fail(self, trainer_id: str, now: float) -> None:
        t = self.trainers.get(trainer_id)
        if t is None or t.state.gone:
            return
        was_member = trainer_id in self.members()
        t.move(TrainerState.FAILED)
        if was_member:
            self._trigger(Reason.FAILURE, now)

    def report(self, report: SyncReport, now: float) -> None:
        """A member stopped at a step boundary (or after a failed collective)."""
        t = self.trainers.get(report.trainer)
        if t is None or self.current is None or report.generation != self.current.id:
            return
        t.last_seen = now
        t.store_port = report.store_port
        t.waiting_since = None  # out of the collective: waiting for the next generation
        if report.failed:
            self._trigger(Reason.FAILURE, now)
        elif self.phase is Phase.RUNNING:
            # A member stopped on its own, e.g. it saw the master restart; treat as resume.
            self._trigger(Reason.RESUME, now)
        self.reports[report.trainer] = report

    def first_step(self, generation: int, now: float) -> None:
        if self.current is not None and self.current.id == generation and self.current.first_step_at is None:
            self.current.first_step_at = now

    def expire(self, now: float) -> None:
        """Declare silent trainers failed and drop members that miss the sync."""
        for t in list(self.trainers.values()):
            if t.state.gone:
                continue
            if now - t.last_seen > self.config.lease_s:
                self.fail(t.id, now)
        if self.current is not None:
            cfg = self.config
            live = [self.trainers[m] for m in self.members()
                    if self.trainers[m].state in (TrainerState.ACTIVE, TrainerState.DRAINING) and m not in self.reports]
            for trainer_id, why in holding_up(live, self.current.id, now, hang_s=cfg.hang_s, silent_s=cfg.silent_s,
                                              stall_s=cfg.stall_s):
                self.excluded.append((trainer_id, why))
                self.fail(trainer_id, now)
        if self.phase is Phase.SYNCING and self.pending_since is not None:
            if now - self.pending_since > self.config.sync_timeout_s:
                for m in self.members():
                    t = self.trainers[m]
                    if m not in self.reports and t.state in (TrainerState.ACTIVE, TrainerState.DRAINING):
                        self.fail(m, now)

    # --------------------------------------------------------------- decision
    def ready_to_form(self, now: float) -> bool:
        cfg = self.config
        if self.phase is Phase.FORMING:
            n = len(self.waiting())
            if n == 0:
                return False
            if n >= min(cfg.desired, cfg.max_trainers):
                return True
            first = self.first_registration_at if self.first_registration_at is not None else now
            waited = now - first
            return n >= cfg.min_trainers and waited >= cfg.start_grace_s
        if self.phase is Phase.SYNCING:
            for m in self.members():
                t = self.trainers[m]
                if t.state in (TrainerState.ACTIVE, TrainerState.DRAINING) and m not in self.reports:
                    return False
            survivors = [m for m in self.members() if self.trainers[m].state is TrainerState.ACTIVE]
            return bool(survivors) or bool(self.waiting())
        return False

    def form(self, now: float, restore_step: int, restore_source: Source, *, lead: str | None = None,
             triggered_at: float | None = None, holders: Collection[str] = ()) -> Formation:
        """Form the next generation. ``restore_*`` apply when no survivor holds model state.

        The first generation of a restarted master may name its ``lead`` (rank 0: the state source), when
        its change began (``triggered_at``: the first re-registration), so that its pause is measured,
        and the ``holders``: joiners whose replicas are already at ``restore_step`` with rank 0's state.
        """
        cfg = self.config
        old = self.current
        survivors = [m for m in self.members() if self.trainers[m].state is TrainerState.ACTIVE]
        departed: dict[str, bool] = {}
        for m in self.members():
            st = self.trainers[m].state
            if st is TrainerState.DRAINING:
                departed[m] = False
            elif st is TrainerState.FAILED:
                departed[m] = True
        room = max(0, cfg.max_trainers - len(survivors))
        joiners = [t.id for t in self.waiting()][:room]

        reason: Reason
        if old is None:
            reason = self.resume_reason
        else:
            reason = self.pending_reason or Reason.SCALE_UP

        rollback = False
        cursors: dict[str, Cursor | None] = {}
        if survivors:
            reporters = [self.reports[m] for m in survivors if m in self.reports]
            best = max(reporters, key=lambda r: r.step) if reporters else None
            base_step = best.step if best else (old.base_step if old else 0)
            cursors = dict(best.cursors) if best else {}
            source = Source.PEER
            # The survivor with the most progress becomes rank 0 and the state source.
            lead = best.trainer if best else survivors[0]
            ordered = [lead] + [m for m in survivors if m != lead] + joiners
            # Survivors of one generation that stopped at the same step hold the same state.
            holding = {lead} | {m for m in survivors if m in self.reports and self.reports[m].step == base_step}
        else:
            base_step = restore_step
            source = restore_source
            rollback = old is not None
            ordered = joiners
            if lead is not None and lead in ordered:
                ordered = [lead] + [j for j in ordered if j != lead]
            holding = set(ordered[:1]) | set(holders)
            if old is not None:
                reason = Reason.FAILURE if reason is not Reason.RESUME else reason
        lead_t = self.trainers[ordered[0]]
        triggered = self.pending_since if (old is not None and self.pending_since is not None) else now
        if old is None and self.first_registration_at is not None:
            triggered = now if triggered_at is None else triggered_at  # start-up is not a pause; a restart is
        gen = Generation(
            id=self.next_generation,
            members=tuple(ordered),
            rendezvous=(lead_t.host, lead_t.store_port),
            base_step=base_step,
            source=source,
            reason=reason,
            triggered_at=triggered,
            formed_at=now,
            cursors=cursors,
            state_to=tuple(r for r, m in enumerate(ordered) if m not in holding),
        )
        if old is not None:
            last = max([r.step for r in self.reports.values()] + [old.base_step])
            gen.rolled_back_steps = max(0, last - base_step)
        self.next_generation += 1
        for m in departed:
            t = self.trainers[m]
            if t.state is TrainerState.DRAINING:
                t.move(TrainerState.LEFT)
        for j in joiners:
            self.trainers[j].move(TrainerState.ACTIVE)
        self.current = gen
        self.history.append(gen)
        self._move(Phase.RUNNING)
        self.pending_reason = None
        self.pending_since = None
        self.reports = {}
        return Formation(gen, departed, rollback)

    def change_pending_for(self, trainer_id: str) -> bool:
        """Should this trainer stop at the next step boundary?"""
        return self.phase is Phase.SYNCING and trainer_id in self.members()

    def aborting(self, trainer_id: str) -> bool:
        """Should this trainer leave its collective now? A member of the generation failed, so the
        collective cannot complete; the others wait for this one's report (its last completed step)."""
        return (self.phase is Phase.SYNCING and self.pending_reason is Reason.FAILURE
                and trainer_id in self.members() and trainer_id not in self.reports)
