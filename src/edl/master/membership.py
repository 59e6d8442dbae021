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
    ACTIVE | DRAINING | WAITING -> FAILED (died, lease expired, or missed the sync)
"""

from __future__ import annotations

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


START_GRACE_S = 20.0  # also what the simulator's jobs wait at start (edl.sim.engine)


@dataclass
class MembershipConfig:
    min_trainers: int
    max_trainers: int
    desired: int
    start_grace_s: float = START_GRACE_S  # at start, wait this long for ``desired`` registrations
    lease_s: float = 10.0  # a trainer silent this long is declared failed
    sync_timeout_s: float = 15.0  # a live member that does not report by then is dropped


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

    def heartbeat(self, trainer_id: str, step: int, now: float) -> Trainer | None:
        t = self.trainers.get(trainer_id)
        if t is None:
            return None
        t.last_seen = now
        t.step = max(t.step, step)
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
             triggered_at: float | None = None) -> Formation:
        """Form the next generation. ``restore_*`` apply when no survivor holds model state.

        The first generation of a restarted master may name its ``lead`` (rank 0: the state source) and
        when its change began (``triggered_at``: the first re-registration), so that its pause is measured.
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
        else:
            base_step = restore_step
            source = restore_source
            rollback = old is not None
            ordered = joiners
            if lead is not None and lead in ordered:
                ordered = [lead] + [j for j in ordered if j != lead]
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
