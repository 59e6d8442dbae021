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

A graceful change (a registration, a drain) is *prepared* instead: the next
generation is planned at once (the staying members in their order, then the
joiners) and announced while the current one trains on. Its members form its
collective in the background and say so (``ready``); once all have, the master
gives the *go*, and the current members switch at the first step at which all of
them have it (their slots say so), reporting that step on their way. The master
then forms exactly the prepared generation at that step (``form`` adopts it). Any
other change before the go re-plans it; a failure, or a switch the master cannot
adopt, drops it: the normal formation follows and members that had switched into
it are told to leave its collective (``dropped``). A preparation that is
not ready in ``prepare_timeout_s`` falls back to stopping at a boundary.

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
from edl.api.master import NO_STATE, START_GRACE_S, Phase, Reason, Source, SyncReport, TrainerState
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
    used_port: int = 0  # the last store port given out as a rendezvous: never given out again

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
    prepared_s: float | None = None  # prepared in the background this long before the switch
    stopped_at: float | None = None  # the generation before stopped stepping (its first member's report)
    cause: str = ""  # what began the change, as the master heard of it ("edl-x-trainer-3 lease expired")

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
    prepare: bool = True  # graceful changes through a prepared generation (else: stop at a boundary)
    # Not every member ready by then: stop at a boundary instead. Longer than the lease, so that a joiner
    # that froze before it formed the group is failed first, and the change planned again without it.
    prepare_timeout_s: float = 15.0


MAX_DEPARTING = 64  # more never wait for their exits at once: those of trainers whose exits went unreported


class Membership:
    """Registrations, heartbeats, drains, failures -> generations."""

    def __init__(self, config: MembershipConfig, first_generation: int = 1) -> None:
        self.config = config
        self.trainers: dict[str, Trainer] = {}
        # Trainers that left (drained, switched out), oldest first, whose processes or pods the launcher has
        # not yet seen end: a launcher that adopts the job counts them as leaving, not as live.
        self.departing: dict[str, None] = {}
        self.phase = Phase.FORMING
        self.current: Generation | None = None
        self.history: list[Generation] = []
        self.next_generation = first_generation
        self.pending_reason: Reason | None = None
        self.pending_since: float | None = None
        self.pending_cause = ""  # what began the pending change
        self.reports: dict[str, SyncReport] = {}
        self.first_report_at: float | None = None  # of the pending change: when training stopped
        self.first_registration_at: float | None = None
        self.resume_reason = Reason.START
        self.excluded: list[tuple[str, str]] = []  # (trainer, why) dropped for holding the others up, in order
        # A graceful change: wanted (to prepare at the next tick), then prepared, then with the go.
        self.wanted: Reason | None = None
        self.wanted_cause = ""  # what began the wanted change (read only while ``wanted`` is set)
        self.prepared: Generation | None = None
        self.prepared_since = 0.0
        self.ready: set[str] = set()  # members of ``prepared`` that formed its collective
        self.go = False  # every member of ``prepared`` is ready: the switch may come at any step
        self.early_first_step: float | None = None  # its first step, heard before it was formed
        self.dropped: set[int] = set()  # prepared generations dropped, never formed: whoever switched in leaves
        self.moves = 0  # trainers' state changes so far (``revision``)

    # ---------------------------------------------------------------- helpers
    def _move(self, to: Phase) -> None:
        self.phase = PHASE_TRANSITIONS.move(self.phase, to)

    def move(self, t: Trainer, to: TrainerState) -> None:
        """A trainer's state changes only here: ``revision`` counts the changes."""
        if to is not t.state:
            t.move(to)
            self.moves += 1
            if to is TrainerState.LEFT:
                self.departing[t.id] = None
                while len(self.departing) > MAX_DEPARTING:  # exits never reported: keep the newest
                    del self.departing[next(iter(self.departing))]

    def exit_reported(self, trainer_id: str) -> None:
        """The launcher saw the trainer's process or pod end: it is no longer leaving."""
        self.departing.pop(trainer_id, None)

    def revision(self) -> tuple:
        """Changes whenever anything a trainer's or the launcher's long poll waits on changes (phase,
        generations, the prepared one and its go, trainers' states, reports, exclusions), and not on a
        heartbeat that only moves a trainer's step or clock. O(1): the master compares it after every
        request and tick, and wakes its long polls only when it moved."""
        cur, p = self.current, self.prepared
        return (self.phase, self.pending_reason, len(self.trainers), self.moves, len(self.reports),
                len(self.history), cur.id if cur else 0, cur is not None and cur.first_step_at is not None,
                p.id if p else 0, self.go, len(self.ready), len(self.dropped), len(self.excluded), self.wanted,
                self.early_first_step is not None)

    def _trigger(self, reason: Reason, now: float, cause: str) -> None:
        """``cause``: what happened, for the generation's record (the first of a change's causes stays)."""
        if self.phase is Phase.RUNNING:
            if reason in (Reason.SCALE_UP, Reason.SCALE_DOWN) and self.config.prepare:
                if not self.go:  # re-planned with this change at the next tick
                    self._drop_prepared()
                self._want(reason, cause)
                return
            self._drop_prepared()
            self._stop(reason, now, cause)
        elif self.phase is Phase.SYNCING and reason is Reason.FAILURE:
            # A failure during a graceful change is still a failure.
            self.pending_reason = reason
        elif self.phase is Phase.SYNCING and self.config.prepare:
            # A drain or a joiner during a switch into the prepared generation, which does not take it in:
            # planned as the change after (a formation that does take it in clears this).
            self._want(reason, cause)

    def _want(self, reason: Reason, cause: str) -> None:
        if self.wanted is None:
            self.wanted, self.wanted_cause = reason, cause

    def _stop(self, reason: Reason, now: float, cause: str) -> None:
        """RUNNING -> SYNCING: the members stop at a common step and report it."""
        self._move(Phase.SYNCING)
        self.pending_reason = reason
        self.pending_since = now
        self.pending_cause = cause
        self.reports = {}
        self.first_report_at = None

    def _drop_prepared(self) -> None:
        if self.prepared is not None:
            self.dropped.add(self.prepared.id)
            self._want(self.prepared.reason, self.prepared.cause)
        self._clear_prepared()

    def _clear_prepared(self) -> None:
        self.prepared, self.ready, self.go, self.early_first_step = None, set(), False, None

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
        self._trigger(Reason.SCALE_UP, now, f"{trainer_id} joined")
        return t

    def heartbeat(self, trainer_id: str, step: int, now: float, generation: int | None = None,
                  in_collective_s: float | None = None, store_port: int | None = None) -> Trainer | None:
        """``generation`` and ``in_collective_s`` (None: not in a collective) say where the trainer's loop
        is; without ``generation`` (a repeated beat of the same request) they stay as they were.
        ``store_port``: where its store would listen for a generation it leads next."""
        t = self.trainers.get(trainer_id)
        if t is None:
            return None
        t.last_seen = now
        if store_port and store_port != t.used_port:
            t.store_port = store_port
        if step > t.step or t.step_at is None:
            t.step_at = now
        t.step = max(t.step, step)
        if generation is not None:
            t.generation = generation
            t.waiting_since = None if in_collective_s is None else now - max(0.0, in_collective_s)
        return t

    def drain(self, trainer_id: str, now: float, why: str = "drained") -> None:
        t = self.trainers[trainer_id]
        if t.state is TrainerState.WAITING:
            self.move(t, TrainerState.LEFT)
            return
        if t.state is not TrainerState.ACTIVE:
            return
        self.move(t, TrainerState.DRAINING)
        self._trigger(Reason.SCALE_DOWN, now, f"{trainer_id} {why}")

    def fail(self, trainer_id: str, now: float, why: str = "failed") -> None:
        t = self.trainers.get(trainer_id)
        if t is None or t.state.gone:
            return
        was_member = trainer_id in self.members()
        self.move(t, TrainerState.FAILED)
        if self.prepared is not None and trainer_id in self.prepared.members and self.phase is Phase.RUNNING:
            self._drop_prepared()  # a joiner of it died: re-planned without it
        if was_member:
            self._trigger(Reason.FAILURE, now, f"{trainer_id} {why}")

    def report(self, report: SyncReport, now: float) -> None:
        """A member stopped at a step boundary (or after a failed collective)."""
        t = self.trainers.get(report.trainer)
        if t is None or self.current is None or report.generation != self.current.id:
            return
        t.last_seen = now
        t.store_port = report.store_port
        t.waiting_since = None  # out of the collective: waiting for the next generation
        if report.failed:
            self._trigger(Reason.FAILURE, now, f"{report.trainer}'s collective failed")
        elif self.phase is Phase.RUNNING:
            p = self.prepared
            if p is not None and self.go and report.switched_to == p.id:
                # The members switched into the prepared generation at this step: its pause starts now.
                self._stop(p.reason, now, p.cause)
            else:
                # A member stopped on its own, e.g. it saw the master restart; treat as resume.
                self._trigger(Reason.RESUME, now, f"{report.trainer} stopped on its own")
        self.reports[report.trainer] = report
        if self.first_report_at is None:
            self.first_report_at = now

    def ready_for(self, trainer_id: str, generation: int, now: float) -> None:
        """A member of the prepared ``generation`` formed its collective; the last one gives the go."""
        p = self.prepared
        if p is None or p.id != generation or trainer_id not in p.members or self.phase is not Phase.RUNNING:
            return
        self.ready.add(trainer_id)
        if self.ready >= set(p.members):
            self.go = True

    def prepare(self, now: float) -> Generation | None:
        """Plan the wanted graceful change as the next generation, announced while the current trains on:
        the staying members in their order (rank 0 stays rank 0 unless it leaves), then the joiners."""
        if self.phase is not Phase.RUNNING or self.wanted is None or self.prepared is not None:
            return None
        survivors = [m for m in self.members() if self.trainers[m].state is TrainerState.ACTIVE]
        joiners = [t.id for t in self.waiting()][: max(0, self.config.max_trainers - len(survivors))]
        leaving = [m for m in self.members() if self.trainers[m].state is not TrainerState.ACTIVE]
        if not joiners and not leaving:
            self.wanted = None  # nothing to change (a joiner left again before it was planned)
            return None
        if not survivors:
            self._stop(self.wanted, now, self.wanted_cause)
            self.wanted = None
            return None
        lead = self.trainers[survivors[0]]
        if not lead.store_port or lead.store_port == lead.used_port:
            return None  # its next store port is not known yet: its next heartbeat says it
        ordered = survivors + joiners
        self.prepared = Generation(
            id=self.next_generation, members=tuple(ordered), rendezvous=(lead.host, lead.store_port), base_step=-1,
            source=Source.PEER, reason=self.wanted, triggered_at=now, formed_at=now,
            state_to=tuple(range(len(survivors), len(ordered))), cause=self.wanted_cause,
        )
        self.next_generation += 1
        lead.used_port = lead.store_port
        self.prepared_since, self.ready, self.go, self.wanted = now, set(), False, None
        return self.prepared

    def _adoptable(self) -> bool:
        """Every member that reported switched into the prepared generation at one step, and its members
        are all still there: form exactly it."""
        p, old = self.prepared, self.current
        if p is None or not self.go or old is None or not self.reports:
            return False
        reports = list(self.reports.values())
        if any(r.failed or r.switched_to != p.id for r in reports) or len({r.step for r in reports}) != 1:
            return False
        live = (TrainerState.ACTIVE, TrainerState.DRAINING)
        return all(self.trainers[m].state in live if m in old.members else self.trainers[m].state is TrainerState.WAITING
                   for m in p.members)

    def switched_in(self, now: float) -> bool:
        """Every member reported switching into the prepared generation at one step: ``form`` adopts it.
        True even while nothing else may form (the job's data all done at that very step): the members
        train in it already, and its rank 0 ends the job there."""
        return self.phase is Phase.SYNCING and self.ready_to_form(now) and self._adoptable()

    def _adopt(self, now: float) -> Formation:
        p, old = self.prepared, self.current
        assert p is not None and old is not None
        report = next(iter(self.reports.values()))
        gen = Generation(
            id=p.id, members=p.members, rendezvous=p.rendezvous, base_step=report.step, source=Source.PEER,
            reason=self.pending_reason or p.reason, triggered_at=self.pending_since or now, formed_at=now,
            cursors=dict(report.cursors), first_step_at=self.early_first_step, state_to=p.state_to,
            prepared_s=(self.pending_since or now) - self.prepared_since, stopped_at=self.first_report_at,
            cause=self.pending_cause or p.cause,
        )
        departed: dict[str, bool] = {}
        for m in old.members:
            if m in p.members:
                continue
            t = self.trainers[m]
            departed[m] = t.state is TrainerState.FAILED
            if t.state is TrainerState.DRAINING:
                self.move(t, TrainerState.LEFT)
        for m in p.members:
            if self.trainers[m].state is TrainerState.WAITING:
                self.move(self.trainers[m], TrainerState.ACTIVE)
        self._clear_prepared()
        return self._install(gen, departed, rollback=False)

    def first_step(self, generation: int, now: float) -> None:
        if self.current is not None and self.current.id == generation and self.current.first_step_at is None:
            self.current.first_step_at = now
        elif self.prepared is not None and self.prepared.id == generation and self.early_first_step is None:
            self.early_first_step = now  # its members switched and stepped before the last report came

    def expire(self, now: float) -> None:
        """Declare silent trainers failed and drop members that miss the sync."""
        for t in list(self.trainers.values()):
            if t.state.gone:
                continue
            if now - t.last_seen > self.config.lease_s:
                self.fail(t.id, now, f"silent for {self.config.lease_s:g} s (its lease)")
        if self.current is not None:
            cfg = self.config
            live = [self.trainers[m] for m in self.members()
                    if self.trainers[m].state in (TrainerState.ACTIVE, TrainerState.DRAINING) and m not in self.reports]
            for trainer_id, why in holding_up(live, self.current.id, now, hang_s=cfg.hang_s, silent_s=cfg.silent_s,
                                              stall_s=cfg.stall_s):
                self.excluded.append((trainer_id, why))
                self.fail(trainer_id, now, f"dropped: {why}")
        p = self.prepared
        if p is not None and not self.go and self.phase is Phase.RUNNING and (
                now - self.prepared_since > self.config.prepare_timeout_s):
            self._drop_prepared()  # its collective did not form in time: stop at a boundary instead
            reason, cause = (self.wanted, self.wanted_cause) if self.wanted else (p.reason, p.cause)
            self.wanted = None
            self._stop(reason, now, cause)
        if self.phase is Phase.SYNCING and self.pending_since is not None:
            if now - self.pending_since > self.config.sync_timeout_s:
                for m in self.members():
                    t = self.trainers[m]
                    if m not in self.reports and t.state in (TrainerState.ACTIVE, TrainerState.DRAINING):
                        self.fail(m, now, f"missed the stop ({self.config.sync_timeout_s:g} s)")

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
             triggered_at: float | None = None, holders: Collection[str] = (), cause: str = "") -> Formation:
        """Form the next generation. ``restore_*`` apply when no survivor holds model state.

        The first generation of a restarted master may name its ``lead`` (rank 0: the state source), when
        its change began (``triggered_at``: the first re-registration), so that its pause is measured,
        and the ``holders``: joiners whose replicas are already at ``restore_step`` with rank 0's state;
        ``cause`` says what began a first generation (a later one's is the change's own).
        """
        if self._adoptable():
            return self._adopt(now)
        self._drop_prepared()
        self.wanted = None  # every change so far is in this formation
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
        reporters = [self.reports[m] for m in survivors if m in self.reports]
        stateless = bool(reporters) and all(r.step == NO_STATE for r in reporters)
        if survivors and not stateless:
            reporters = [r for r in reporters if r.step != NO_STATE]
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
            # Nobody left holds a state (all died, or the generation failed before its state reached
            # anyone): from the checkpoint (or from scratch), survivors and joiners alike.
            base_step = restore_step
            source = restore_source
            rollback = old is not None
            ordered = survivors + joiners
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
            stopped_at=self.first_report_at if old is not None else None,
            cause=self.pending_cause if old is not None else (cause or "the job started"),
        )
        if old is not None:
            last = max([r.step for r in self.reports.values()] + [old.base_step])
            gen.rolled_back_steps = max(0, last - base_step)
        self.next_generation += 1
        lead_t.used_port = lead_t.store_port
        for m in departed:
            t = self.trainers[m]
            if t.state is TrainerState.DRAINING:
                self.move(t, TrainerState.LEFT)
        for j in joiners:
            self.move(self.trainers[j], TrainerState.ACTIVE)
        return self._install(gen, departed, rollback)

    def _install(self, gen: Generation, departed: dict[str, bool], rollback: bool) -> Formation:
        self.current = gen
        self.history.append(gen)
        self._move(Phase.RUNNING)
        self.pending_reason = None
        self.pending_since = None
        self.pending_cause = ""
        self.reports = {}
        self.first_report_at = None
        return Formation(gen, departed, rollback)

    def prepared_for(self, trainer_id: str) -> Generation | None:
        """The prepared generation, for its members and the current generation's."""
        p = self.prepared
        if p is None or (trainer_id not in p.members and trainer_id not in self.members()):
            return None
        return p

    def in_dropped_prepared(self, trainer_id: str) -> bool:
        """The trainer switched into a prepared generation the master dropped (it will never be formed): it
        must leave its collective, whatever formed since."""
        t = self.trainers.get(trainer_id)
        return t is not None and t.generation in self.dropped

    def change_pending_for(self, trainer_id: str) -> bool:
        """Should this trainer stop at the next step boundary?"""
        return self.phase is Phase.SYNCING and trainer_id in self.members()

    def aborting(self, trainer_id: str) -> bool:
        """Should this trainer leave its collective now? A member of the generation failed, so the
        collective cannot complete; the others wait for this one's report (its last completed step)."""
        return (self.phase is Phase.SYNCING and self.pending_reason is Reason.FAILURE
                and trainer_id in self.members() and trainer_id not in self.reports)
