"""The launcher: owns one job's lifecycle on any cluster backend.

It creates (or adopts) the job's objects, keeps the trainers at the master's
desired count by applying ``plan_trainers``, replaces a lost master, reports
trainer exits to the master, fails the job on OOM, bad input or too many
crashes, writes the run summary when the job ends (``finish``), and on cancel
asks for a last checkpoint before removing everything.
The backend (``Cluster``) is the only thing that differs between Kubernetes,
local processes and the simulator.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from edl.api.cluster import Cluster, MasterEndpoint, SizeCause, TrainerExit, TrainerPod
from edl.api.master import REPLACEMENT_HOLD_S, BudgetView, ControlLink, JobStatus, JobView, Phase, TrainerState
from edl.api.policy import free_hints
from edl.api.spec import JobSpec
from edl.console import Bar, Console, clip, plain_console, progress_bars, say
from edl.errors import EdlError, KubeForbiddenError, PermanentError, TemporaryError, UserError
from edl.files import write_json_atomic
from edl.launcher.budget import Budget, BudgetPolicy
from edl.launcher.reconcile import Plan, plan_trainers
from edl.launcher.watch import StatusWatch
from edl.masterlink import HttpMaster
from edl.storage.audit import audit

log = logging.getLogger("edl.launcher")
# A master whose pod looks alive but that has not answered for this long is replaced.
MASTER_SILENCE_LIMIT_S = 60.0
BEAT_EVERY_S = 1.0  # at most one beat a second (the local launcher polls ten times a second)
# The background beats stop once the launcher's own loop has not come round for this long: a launcher
# wedged for good must not keep its job alive. Longer than any bounded wait of one round (a master's
# graceful delete and its successor's start, API calls retried while the API is away).
LOOP_STALL_S = 600.0


def size_event(cause: SizeCause) -> str:
    """The Event reason of a change of why the job is at its size: ``Size`` and the cause, CamelCase
    (``SizeHandedBack``, ``SizeNotWorthPause``)."""
    return "Size" + "".join(w.capitalize() for w in cause.value.split("_"))


def http_master(endpoint: MasterEndpoint) -> HttpMaster:
    """The launcher's link to the master: one attempt per call (every tick asks again)."""
    return HttpMaster(endpoint.address, endpoint.token, timeout_s=5.0, give_up_s=0.0)


class ProgressView:
    """Progress bars per epoch on a terminal, a line every 10 s otherwise, one line per generation."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = progress_bars(console, done="count", info=True, transient=False)
        self.bars: dict[int, Bar] = {}
        self.shown_generations = 0
        self.last_line = 0.0

    def __enter__(self) -> "ProgressView":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def show(self, st: JobView) -> None:
        for e in range(st.epochs):
            done = st.done_rows[e]
            if e not in self.bars and (done > 0 or e == st.epoch):
                self.bars[e] = self.progress.add_task(f"epoch {e + 1}/{st.epochs}", total=st.rows_per_epoch, info="")
            if e in self.bars:
                self.progress.update(self.bars[e], completed=done,
                                     info=f"gen {st.generation} · {st.world_size} trainers · step {st.step}")
        gens = st.generations
        while self.shown_generations < len(gens):
            g = gens[self.shown_generations]
            if g.pause_s is None and self.shown_generations == len(gens) - 1 and st.status is JobStatus.RUNNING:
                break  # wait until its pause is known
            prev = gens[self.shown_generations - 1].world_size if self.shown_generations else 0
            pause = "" if g.pause_s is None else f", pause {g.pause_s:.2f} s"
            back = f", rolled back {g.rolled_back_steps} steps" if g.rolled_back_steps else ""
            say(self.progress.console,
                f"generation {g.id}: {prev} → {g.world_size} trainers ({g.reason.value}){pause}{back}")
            self.shown_generations += 1
        if not self.console.is_terminal and time.monotonic() - self.last_line > 10:
            self.last_line = time.monotonic()
            e = min(st.epoch, st.epochs - 1)
            pct = 100.0 * st.done_rows[e] / max(1, st.rows_per_epoch)
            say(self.console, f"epoch {e + 1}/{st.epochs}: {pct:5.1f} % · {st.world_size} trainers · step {st.step}")


@dataclass(frozen=True)
class JobResult:
    """A job that succeeded, as its run summary tells it (``Launcher.finish``)."""

    summary: dict[str, Any]  # the master's run summary with the launcher's counters, as written

    @property
    def epochs_completed(self) -> int:
        return self.summary["epochs_completed"]

    @property
    def steps(self) -> int:
        return self.summary["steps"]

    @property
    def final_model_uri(self) -> str | None:
        return self.summary["final_model_uri"]

    @property
    def throughput_samples_per_s(self) -> float:
        return self.summary["throughput_samples_per_s"]

    @property
    def metrics(self) -> dict[str, float]:
        return self.summary.get("metrics") or {}

    @property
    def lost_samples(self) -> int | None:
        return self.summary.get("lost_samples")  # with --audit only

    @property
    def duplicate_samples(self) -> int | None:
        return self.summary.get("duplicate_samples")


class Cancelled(Exception):
    """SIGTERM or SIGINT: the run was cancelled."""


# The exit code reported for a trainer whose pod vanished before its exit was seen: a kill, as far as
# the master knows (it fails the trainer, if it has not left).
VANISHED_EXIT = 137


class Launcher:
    def __init__(self, spec: JobSpec, cluster: Cluster, *, max_trainer_failures: int = 5,
                 pending_timeout_s: float = 120.0, drain_timeout_s: float = 60.0, trainer_prefix: str = "",
                 console: Console | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, max_master_restarts: int = 10,
                 master_start_timeout_s: float = 300.0, api_away_limit_s: float = 600.0,
                 master_silence_limit_s: float = MASTER_SILENCE_LIMIT_S,
                 master_factory: Callable[[MasterEndpoint], ControlLink] = http_master,
                 beat_in_background: bool = False, beat_every_s: float = BEAT_EVERY_S,
                 loop_stall_s: float = LOOP_STALL_S, status_watch: StatusWatch | None = None) -> None:
        self.spec = spec
        self.cluster = cluster
        # Failures are forgiven by progress (``edl.launcher.budget``): a long life of disruptions is not a
        # crash loop. ``progress`` is the highest step the master reported.
        self.trainer_budget = Budget(BudgetPolicy(max_trainer_failures))
        self.master_budget = Budget(BudgetPolicy(max_master_restarts))
        self.progress = 0
        self.pending_timeout_s = pending_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.prefix = trainer_prefix or f"{spec.job}-t"
        self.console = console or plain_console()
        self.clock = clock
        self.sleep = sleep
        self.master_start_timeout_s = master_start_timeout_s
        self.api_away_limit_s = api_away_limit_s
        self.api_away_since: float | None = None  # the cluster's API stopped answering then
        self.master_silence_limit_s = master_silence_limit_s
        self.master_silent_since: float | None = None  # a master that looks alive stopped answering then
        # How to talk to the master: HTTP with the job token, or the simulator's job model.
        self.master_factory = master_factory
        self.draining: dict[str, float] = {}  # trainer -> when it was asked to drain (this launcher's clock)
        self.drained_by: dict[str, str] = {}  # trainer -> the uid of the master its drain was asked of
        self._master_order: dict[str, int] = {}  # master uid -> the order this launcher first saw it in
        self._budgets_known = True  # False while an adopted job's budgets are not read yet: beats carry none
        self._first_round = True
        self.relaunches = 0
        self.unschedulable = 0
        self.counter = 0  # the highest trainer index used or seen: names are never reused
        self.first_seen: dict[str, float] = {}  # trainer -> when this launcher first saw it (its clock)
        self.endpoint: MasterEndpoint | None = None
        self.last_status: JobView | None = None  # the master's status as the last tick read it
        self.master: ControlLink | None = None
        self.cancelled = False
        self.last_beat: float | None = None  # when the master last heard this launcher is alive
        self.beat_every_s = beat_every_s
        # Beat from a thread of its own as well (real time; callers on a virtual clock leave it off), so
        # that no blocking wait of a round silences the launcher: an API call retried for seconds, a
        # master's graceful delete, a successor's start.
        self.beat_in_background = beat_in_background
        self.loop_stall_s = loop_stall_s
        self.loop_at = clock()  # when the launcher's loop last came round
        self._stop_beating = threading.Event()
        # With a watch (real time), a round takes the master's status from the watch's long poll instead of
        # asking for it (``edl.launcher.watch``), unless the watch's copy may be too old for what the round
        # decides: on the first round, after a new master, when the trainers changed, or when the copy is
        # older than a status this launcher already used.
        self.status_watch = status_watch
        self._read_now = True
        self._trainers_seen: tuple | None = None  # the trainers as the last round saw them
        self._cause_seen: SizeCause | None = None  # the cause of the job's size the last Event gave
        self._held_seen: tuple[str, ...] = ()  # trainers told to stop, held for the sidecar, as last said
        self._started_told = 0  # the newest generation whose first step an Event gave (with its chain)
        self._used: tuple[str, int] = ("", 0)  # master uid and control version of the status the last round used
        self._used_serial = 0  # the watch's reading that status came from (0: read directly)
        self._from_watch = False  # the round's status is the watch's copy (not read by the round itself)

    @property
    def failures(self) -> int:
        """Trainer failures over the job's life (preemptions and drains are not failures)."""
        return self.trainer_budget.total

    @property
    def link(self) -> ControlLink:
        """The link to the job's master, once ``start`` made it."""
        assert self.master is not None, "the launcher has not started"
        return self.master

    @property
    def master_restarts(self) -> int:
        return self.master_budget.total

    def budget_views(self) -> dict[str, BudgetView]:
        """The failure budgets as the status shows them (sent with each beat; none while an adopted job's
        are not read yet)."""
        if not self._budgets_known:
            return {}
        return {kind: b.view() for kind, b in self._settled_budgets().items()}

    def _settled_budgets(self) -> dict[str, Budget]:
        """The budgets by kind as of now, with what progress or time forgave refunded."""
        now = self.clock()
        return {"master_restarts": self.master_budget.settled(now, self.progress),
                "trainer_failures": self.trainer_budget.settled(now, self.progress)}

    # --------------------------------------------------------------- start
    def start(self) -> MasterEndpoint:
        self.endpoint = self.cluster.ensure_job()
        self.master = self.master_factory(self.endpoint)
        if self.status_watch is not None:
            self.status_watch.follow(self.endpoint)
        # An adopted job's budgets are the launcher's before this one (the master shows them): beats carry
        # none until they are read, or the first would wipe them.
        self._budgets_known = not self.endpoint.adopted
        if self.beat_in_background:
            threading.Thread(target=self._beat_in_background, name="edl-launcher-beat", daemon=True).start()
        self._seen_names(t.name for t in self.cluster.trainers())  # adopted: continue after theirs
        self.wait_for_master()
        if not self._budgets_known:
            try:
                st = self.link.status()
            except TemporaryError:
                st = None
            if st is not None:
                self._carry_on_budgets(st)  # else from the first round's status
        return self.endpoint

    def _carry_on_budgets(self, st: JobView) -> None:
        """The failure budgets and progress of the launcher before this one, from the master's status (as
        its last beat settled them): a crash loop is not forgiven by a launcher restart, and the summary
        counts the job's whole life. A master restarted meanwhile shows none: they start afresh."""
        now = self.clock()
        self.progress = max(self.progress, st.step)
        if seen := st.budgets.get("master_restarts"):
            self.master_budget = self.master_budget.carried_on(seen, self.progress, now)
        if seen := st.budgets.get("trainer_failures"):
            self.trainer_budget = self.trainer_budget.carried_on(seen, self.progress, now)
        self._budgets_known = True

    def _seen_names(self, names: Iterable[str], highest: int = 0) -> None:
        """Number new trainers after every name seen: a pod of the job, or one the master knows, and after
        ``highest``, the master's highest (``JobView.highest_trainer_number``: a trainer a launcher before
        this one started, drained and removed is gone from the status but not from the master's books, which
        refuse its name back)."""
        self.counter = max(self.counter, highest)
        for name in names:
            suffix = name.removeprefix(self.prefix)
            if name.startswith(self.prefix) and suffix.isdigit():
                self.counter = max(self.counter, int(suffix))

    def _observed_trainers(self, now: float) -> list[TrainerPod]:
        """The job's trainers, pending time counted from first sight on this launcher's clock (the
        apiserver's creationTimestamp is on another clock: skew would mark new pods unschedulable)."""
        trainers = self.cluster.trainers()
        self.first_seen = {t.name: self.first_seen.get(t.name, now) for t in trainers}
        return [replace(t, created_at=self.first_seen[t.name]) for t in trainers]

    def wait_for_master(self) -> None:
        deadline = self.clock() + self.master_start_timeout_s
        while self.clock() < deadline:
            self.loop_at = self.clock()
            if self.link.healthy():
                return
            if not self.cluster.master_alive():
                self._master_lost()
            self.sleep(0.1)
        raise PermanentError(f"master of job {self.spec.job} did not answer within {self.master_start_timeout_s:.0f} s")

    def _master_lost(self) -> None:
        budget = self.master_budget = self.master_budget.charge(self.clock(), self.progress)
        if budget.exhausted:
            raise PermanentError(f"master of job {self.spec.job} keeps dying: {budget.spent} restarts with no "
                                 f"training step between them (limit {budget.policy.limit})")
        wait = budget.backoff_s()
        message = "master lost; replacing it (by its spare where one is ready); the trainers go on from their step" + (
            f" in {wait:.1f} s: {budget.spent - 1} restart(s) since the last step" if wait else "")
        self.cluster.record("MasterLost", message, warning=True)
        say(self.console, message)
        if wait:
            self.sleep(wait)
        address = self.cluster.recreate_master()
        # A new link: the successor's address (pod-ip: its own), and no kept-alive connection that a
        # Service's connection tracking would still route to the old master while it lives on.
        assert self.endpoint is not None
        self.endpoint = replace(self.endpoint, address=address)
        self.master = self.master_factory(self.endpoint)
        self._read_now = True
        if self.status_watch is not None:
            self.status_watch.follow(self.endpoint)

    # ---------------------------------------------------------------- loop
    def _tell(self, report: Callable[[], object]) -> bool:
        """Report to the master once; ``False`` when it cannot be reached (the report is dropped:
        what it said is either seen again next round or no longer matters)."""
        try:
            report()
            return True
        except TemporaryError:
            return False

    def beat(self) -> None:
        """Tell the master this launcher is alive (its dead-man switch, ``edl.master.deadman``). Sent
        before anything asks the cluster's API, which may be away: the master is reached without it.
        Called by the launcher's loops: it also marks the loop as coming round."""
        self.loop_at = self.clock()
        self._beat()

    def _beat(self) -> None:
        now, master = self.clock(), self.master  # the link may be replaced meanwhile (a new master)
        if master is not None and (self.last_beat is None or now - self.last_beat >= self.beat_every_s):
            if self._tell(lambda: master.launcher_beat(self.budget_views())):
                self.last_beat = now

    def _beat_in_background(self) -> None:
        stalled = False
        while not self._stop_beating.wait(self.beat_every_s):
            if self.clock() - self.loop_at > self.loop_stall_s:
                if not stalled:
                    log.warning("the launcher's loop has not come round for %.0f s: no more beats; its master "
                                "ends the job after its --launcher-timeout", self.loop_stall_s)
                stalled = True
                continue
            stalled = False
            try:
                self._beat()
            except EdlError as e:  # a refused beat (401, 4xx): the loop's own calls hear of it
                log.debug("background beat: %s", e)

    def tick(self) -> JobView | None:
        """One round. Returns the master's status once the job is no longer running."""
        if not self.cluster.master_alive():
            self._master_lost()
            self.wait_for_master()
        st = self._status()
        if st is None:
            self._master_silent()
            return None
        self.master_silent_since = None
        self.last_status = st
        if st.status is not JobStatus.RUNNING:
            return st
        self._apply(st)
        return None

    def _status(self) -> JobView | None:
        """The master's status for this round: the watch's newest copy where it will do, else read now."""
        reading = self.status_watch.latest() if self.status_watch is not None and not self._read_now else None
        if reading is not None and reading.endpoint == self.endpoint:
            if reading.error is not None:
                raise reading.error
            st = reading.view
            if st is None or st.control_version == 0 or self._newer_or_same(st):
                self._used_serial, self._from_watch = reading.serial, True
                return self._use(st)
        self._read_now, self._from_watch = False, False
        self._used_serial = self.status_watch.latest_serial() if self.status_watch is not None else 0
        return self._use(self.link.status())

    def _newer_or_same(self, st: JobView) -> bool:
        """``st`` is no older than the status the last round used (or comes from another master)."""
        uid, version = self._used
        return st.master_uid != uid or st.control_version >= version

    def _use(self, st: JobView | None) -> JobView | None:
        if st is not None:
            self._used = (st.master_uid, st.control_version)
        return st

    def _master_silent(self) -> None:
        """The master's pod looks alive but the master does not answer (a partition, a hung
        process): past ``master_silence_limit_s`` it counts as lost and is replaced."""
        now = self.clock()
        if self.master_silent_since is None:
            self.master_silent_since = now
        elif now - self.master_silent_since > self.master_silence_limit_s:
            self.master_silent_since = None
            say(self.console, f"master of job {self.spec.job} has not answered for over "
                              f"{self.master_silence_limit_s:.0f} s")
            self._master_lost()
            self.wait_for_master()

    def _find_leaving(self, st: JobView, trainers: list[TrainerPod], now: float) -> None:
        """An adopted job: the trainers a launcher before this one drained are still leaving, whether the
        master lists them as draining or has let them go already (``JobView.departing``) while their
        processes or pods still end. Counted as live, they would make another trainer look excess."""
        leaving = {t.id for t in st.trainers if t.state is TrainerState.DRAINING} | set(st.departing)
        for t in trainers:
            if t.name in leaving and not t.phase.terminated and t.name not in self.draining:
                self.draining[t.name], self.drained_by[t.name] = now, st.master_uid

    def _forget_void_drains(self, st: JobView) -> None:
        """A drain asked of a master since replaced is void (its successor never heard of it: the trainer
        re-registered and trains on): once a newer master lists it as waiting or active, it is live again
        (and drained anew if it is excess). A drain stands on a status of the master it was asked of, or
        of an older one (a late answer), which may still list the trainer active."""
        order = self._master_order.setdefault(st.master_uid, len(self._master_order))
        for t in st.trainers:
            asked_of = self.drained_by.get(t.id)
            if (asked_of is not None and self._master_order.get(asked_of, -1) < order
                    and t.state in (TrainerState.WAITING, TrainerState.ACTIVE)):
                del self.drained_by[t.id]
                self.draining.pop(t.id, None)

    def _plan(self, st: JobView, trainers: list[TrainerPod], now: float) -> Plan:
        return plan_trainers(st.desired_trainers, trainers, self.draining, now, self.pending_timeout_s,
                             self.drain_timeout_s, data_done=st.epochs_completed >= st.epochs,
                             node_hints=st.node_hints, held=st.held_replacements, replacing=st.replacing)

    def _apply(self, st: JobView) -> None:
        now = self.clock()
        self.progress = max(self.progress, st.step)
        trainers = self._observed_trainers(now)
        self._seen_names([t.name for t in trainers] + [t.id for t in st.trainers], st.highest_trainer_number)
        if not self._budgets_known:
            self._carry_on_budgets(st)
        self._forget_void_drains(st)
        if self._first_round:
            self._first_round = False
            self._find_leaving(st, trainers, now)
            # An adopted job's generations so far were told by the launcher before this one.
            self._started_told = max((g.id for g in st.generations if g.first_step_at is not None), default=0)
        plan = self._plan(st, trainers, now)
        by_name = {t.name: t for t in trainers}
        told: set[str] = set()
        if plan.relaunched and plan.create:
            # Replacements are decided on the pods seen now, against a size read before them: a sidecar that
            # handed the room back meanwhile (the same preemption, seen from its side) would have it taken
            # again by the replacement. The master is told of the preemptions first (it holds the places of
            # preempted trainers for the sidecar's next decision, ``held_replacements``), then the size is
            # read afresh. Whichever comes first, the report or a decision the sidecar is making now, the places
            # stay empty until a decision that saw the preemption.
            for name, code in plan.exited:
                if name in plan.relaunched and by_name[name].exit is TrainerExit.PREEMPTED:
                    self._tell(lambda: self.link.report_exit(name, code, preempted=True))
                    told.add(name)
            fresh = self.link.status()
            if fresh is not None:
                st = self.last_status = self._use(fresh)  # type: ignore[assignment]
                self._from_watch = False
                plan = self._plan(st, trainers, now)
        seen = tuple((t.name, t.phase, t.exit) for t in trainers)
        # A trainer that came or went (an exit this round reports, one it starts): the next round reads the
        # master afresh rather than the watch's copy, which may predate it (see ``plan_trainers`` on exits).
        self._read_now = self._read_now or seen != self._trainers_seen
        # A pod that vanished without the launcher seeing its exit (deleted by force, or gracefully between two
        # rounds) has no process left: told now, its master re-forms at once instead of waiting out the
        # lease. (A trainer that already left is gone to the master, which ignores the report.)
        vanished = sorted({name for name, phase, _ in self._trainers_seen or () if not phase.terminated}
                          - {t.name for t in trainers})
        self._trainers_seen = seen
        for name, code in [*plan.exited, *((name, VANISHED_EXIT) for name in vanished)]:
            if name not in told:
                self._tell(lambda: self.link.report_exit(name, code))
        for name in plan.relaunched:
            self.relaunches += 1
            t = by_name[name]
            assert t.exit is not None  # relaunched for how it exited
            self.cluster.record("TrainerReplaced", f"trainer {name} {t.exit.value}: {t.message}; replacing it")
            say(self.console, f"trainer {name} {t.exit.value} ({t.message}); replacing it")
        for name, message in plan.failures:
            budget = self.trainer_budget = self.trainer_budget.charge(now, self.progress)
            self.cluster.record("TrainerFailed", f"{name}: {message}", warning=True)
            say(self.console, f"trainer {name} failed: {clip(message)}")
            if budget.exhausted:
                raise PermanentError(f"{budget.spent} trainer failures with no training step between them "
                                     f"(limit {budget.policy.limit}); last: {clip(message)}")
        if plan.fatal is not None:
            why, message = plan.fatal
            self.cluster.record("TrainerFatal", message, warning=True)
            user = why in (TrainerExit.USER_ERROR, TrainerExit.CANNOT_START)  # a bad image, a missing key
            self._tell(lambda: self.link.fail_job(message, user))
            raise UserError(message) if user else PermanentError(message)
        if new_held := sorted(set(st.held_replacements) - set(self._held_seen)):
            say(self.console, f"trainer(s) {', '.join(new_held)} told to stop: replaced once the sidecar's next "
                              f"decision still asks for them (or in {REPLACEMENT_HOLD_S:.0f} s without one)")
        self._held_seen = st.held_replacements
        for g in st.generations[self._started_told:]:  # ids count from 1 in order: only the newer ones
            if g.first_step_at is not None:
                self._started_told = g.id
                self.cluster.record("GenerationStarted", g.describe())
        if st.reason is not None and st.reason.cause is not self._cause_seen:
            self._cause_seen = st.reason.cause
            self.cluster.record(size_event(st.reason.cause), st.reason.text)
        if plan.unschedulable:
            self.unschedulable += len(plan.unschedulable)
            msg = (f"{len(plan.unschedulable)} trainer pod(s) Pending for over {self.pending_timeout_s:.0f} s: "
                   "removed and reported unschedulable")
            self.cluster.record("TrainersUnschedulable", msg, warning=True)
            say(self.console, msg)
            self._tell(lambda: self.link.report_unschedulable(len(plan.unschedulable)))
        for name in plan.delete:
            self.cluster.delete_trainer(name)
            self.draining.pop(name, None)
            self.drained_by.pop(name, None)
        if plan.drain and st.phase is Phase.RUNNING:
            for name in plan.drain:
                try:
                    known = self.link.drain(name)
                except TemporaryError:
                    continue  # the master is away: the next round drains it
                if known:
                    self.draining[name] = now
                    self.drained_by[name] = st.master_uid
                else:  # not registered (yet): nothing to hand over, remove it
                    self.cluster.delete_trainer(name)
            self.cluster.record("ScaleDown", f"draining {', '.join(plan.drain)} (desired "
                                             f"{st.desired_trainers})")
        if plan.create:
            # The sidecar's plan names a node per trainer: new ones prefer those no trainer that stays
            # holds or prefers yet (preferred only: the scheduler still places them where there is room).
            leaving = {*plan.delete, *plan.drain, *self.draining}
            hints = free_hints(st.node_hints, (t.node or t.hint for t in trainers
                                               if not t.phase.terminated and t.name not in leaving))
            names = []
            for k in range(plan.create):
                self.counter += 1
                names.append(f"{self.prefix}{self.counter}")
                self.cluster.create_trainer(names[-1], hints[k] if k < len(hints) else None)
            self.cluster.record("ScaleUp", f"started {', '.join(names)} (desired {st.desired_trainers})")

    def run(self, view: ProgressView | None = None, poll_s: float = 0.1) -> JobView:
        """Until the job ends; returns the master's final status. ``Cancelled`` propagates.

        While the cluster's API is away (``TemporaryError`` after the edge's own retries) the
        plan is held: nothing is created or deleted, the job's pods go on as they are; the
        next round carries on from what the cluster then shows. Away longer than
        ``api_away_limit_s``: the job fails."""
        shown: JobView | None = None  # watching, the status last shown (a copy is shown once)
        while True:
            self.beat()
            try:
                st = self.tick()
            except TemporaryError as e:
                self._api_away(e)
                self._pause(poll_s)
                continue
            except KubeForbiddenError as e:
                if self.api_away_since is None:
                    raise
                # Just back from a restart, an apiserver refuses until its RBAC caches are filled:
                # still away (bounded by api_away_limit_s), not a revoked permission.
                self._api_away(e)
                self._pause(poll_s)
                continue
            self._api_back()
            if st is not None:
                return st
            if view is not None and self.last_status is not None and self.last_status is not shown:
                view.show(self.last_status)  # what this round's tick read: no second request
                shown = self.last_status if self.status_watch is not None else None
            self._pause(poll_s)

    def _pause(self, poll_s: float) -> None:
        """Between rounds: ``poll_s``, or (watching) until the watch has a newer reading, if sooner."""
        if self.status_watch is None:
            self.sleep(poll_s)
        else:
            self.status_watch.wait_newer(self._used_serial, poll_s)
            # Woken once per reading, whether or not the next round uses it (a round that fails before it
            # reads the status must not find the same reading "newer" again and spin).
            self._used_serial = max(self._used_serial, self.status_watch.latest_serial())

    def _api_away(self, e: Exception) -> None:
        now = self.clock()
        if self.api_away_since is None:
            self.api_away_since = now
            say(self.console, f"cluster API away ({(str(e).splitlines() or [type(e).__name__])[0][:200]}); "
                              "holding the plan")
        elif now - self.api_away_since > self.api_away_limit_s:
            raise PermanentError(f"cluster API away for over {self.api_away_limit_s:.0f} s: {e}") from e

    def _api_back(self) -> None:
        if self.api_away_since is not None:
            away = self.clock() - self.api_away_since
            self.api_away_since = None
            say(self.console, f"cluster API back after {away:.0f} s; carrying on")

    # ----------------------------------------------------------- endings
    def finish(self, summary_out: Path | None = None,
               extend: Callable[[dict[str, Any]], None] | None = None) -> JobResult:
        """After ``run``: wait for the trainers to exit, then the run summary, the master's with what
        only the launcher counted (and what ``extend`` adds), written to ``summary_out``.
        Raises with the job's error unless it succeeded: ``UserError`` (exit 2) when the master
        failed it because of the user's input, else ``PermanentError``."""
        self.wait_for_trainers()
        summary = (self.master.summary() if self.master is not None else None) or {
            "job": self.spec.job, "status": JobStatus.FAILED.value, "error": "master lost"}
        if extend is not None:
            extend(summary)
        summary.update(trainer_failures=self.failures, trainer_relaunches=self.relaunches,
                       unschedulable_trainers=self.unschedulable, master_restarts=self.master_restarts,
                       budgets={kind: b.to_json() for kind, b in self._settled_budgets().items()})
        if summary_out is not None:
            write_json_atomic(summary_out, summary)
        if summary["status"] != JobStatus.SUCCEEDED.value:
            if summary.get("user_error"):
                raise UserError(summary["error"])  # it names the culprit
            raise PermanentError(f"job {self.spec.job} failed: {summary.get('error')}")
        return JobResult(summary)

    def wait_for_trainers(self, timeout_s: float = 120.0) -> None:
        """Let trainers exit on their own (rank 0 exports the model), then report them."""
        deadline = self.clock() + timeout_s
        while self.clock() < deadline:
            self.beat()
            try:
                live = [t for t in self.cluster.trainers() if not t.phase.terminated]
            except TemporaryError:
                live = None  # the API is away: not known yet
            if live == []:
                break
            self.sleep(0.1)

    def final_checkpoint(self, budget_s: float = 20.0) -> bool:
        """Ask for a checkpoint now and wait (within ``budget_s``) until one more is committed."""
        if self.master is None:
            return False
        st = self.link.status()
        if st is None or st.status is not JobStatus.RUNNING:
            return False
        before = len(st.checkpoints)
        if not self._tell(self.link.request_checkpoint):
            return False
        deadline = self.clock() + budget_s
        while self.clock() < deadline:
            self.beat()
            st = self.link.status()
            if st is not None and len(st.checkpoints) > before:
                return True
            self.sleep(0.2)
        return False

    def shutdown(self, delete: bool = True) -> None:
        """Stop the master and remove every object of the job (idempotent)."""
        self._stop_beating.set()
        if self.status_watch is not None:
            self.status_watch.stop()
        if self.master is not None:
            self._tell(self.link.shutdown)
        if delete:
            self.cluster.delete_job()


def audit_summary(spec: JobSpec, summary: dict[str, Any]) -> None:
    """``--audit``: count every record id that entered the final model, from the log the trainers
    wrote under the job's checkpoint prefix (wherever they ran), into the run summary."""
    from edl.data.dataset import Dataset, resolve_splits
    from edl.storage.store import open_store

    data, _ = resolve_splits(spec.data)
    result = audit(open_store(spec.checkpoint_uri, "--checkpoint-uri"), Dataset(data).all_ids(), spec.epochs)
    summary["lost_samples"] = result.lost
    summary["duplicate_samples"] = result.duplicates
    summary["audited_samples_per_epoch"] = result.samples_per_epoch
