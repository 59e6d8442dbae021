"""The master's whole job state: spec, task queue, membership, checkpoints, outcome.

Pure and clock-injected: the HTTP layer (``server.py``) calls these methods with
``now`` and turns their answers into responses. Nothing here does I/O; its settings
come in a ``Timeouts`` (``main.py`` reads them from the environment).

The job's status moves only through ``STATUS_TRANSITIONS``::

    RUNNING -> SUCCEEDED | FAILED
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edl.api.cluster import SizeCause, SizeReason
from edl.api.data import Cursor, Shard, Task
from edl.api.master import (
    REPLACEMENT_HOLD_S,
    Assignment,
    BudgetView,
    CheckpointRecord,
    GenerationSummary,
    HeartbeatAnswer,
    JobStatus,
    JobView,
    Next,
    NoAssignment,
    Phase,
    Prepared,
    Reason,
    ResumeReport,
    Source,
    SyncReport,
    TrainerState,
    TrainerView,
    Unassigned,
    UserCodeFailure,
    to_json,
    trainer_number,
)
from edl.api.spec import JobSpec
from edl.errors import PermanentError, StaleError, UserError
from edl.master.deadman import DeadMan, LauncherState
from edl.master.membership import Formation, Membership, MembershipConfig
from edl.master.resume import CutRecord, Restored, plan_resume
from edl.master.tasks import TaskQueue
from edl.master.transitions import Transitions
from edl.master.usercode import UserCodeFailures

MAX_REASONS = 100  # the changes of a job's size reason kept for its summary
# What began a restarted master's first generation (its ``cause``): the master before it was lost.
RESTART_CAUSE = "a new master: the one before was lost, its trainers registered again"

STATUS_TRANSITIONS = Transitions("job status", {
    JobStatus.RUNNING: {JobStatus.SUCCEEDED, JobStatus.FAILED},
    JobStatus.SUCCEEDED: set(),
    JobStatus.FAILED: set(),
})


@dataclass(frozen=True)
class Timeouts:
    """How long the master waits on trainers, and how it changes generations."""

    lease_s: float = MembershipConfig.lease_s  # a trainer silent this long is declared failed
    sync_timeout_s: float = MembershipConfig.sync_timeout_s  # a member that does not report by then is dropped
    prepare: bool = MembershipConfig.prepare  # graceful changes through a prepared generation


class Job:
    def __init__(
        self,
        spec: JobSpec,
        shards: list[Shard],
        master_uid: str,
        now: float,
        restored: dict | None = None,
        restored_uri: str | None = None,
        timeouts: Timeouts = Timeouts(),
        wall_offset: float = 0.0,
    ) -> None:
        self.spec = spec
        self.master_uid = master_uid
        self.status = JobStatus.RUNNING
        self.error: str | None = None
        self.user_error = False  # failed because of the user's input: the launcher exits 2
        self.user_code = UserCodeFailures(spec.model_def)
        self.started_at = now
        # Wall-clock seconds minus the job's clock (the ``now`` its calls get, a monotonic one): a
        # generation's record gives when its change began as a wall-clock time too, which other
        # machines' records (a fault's, the next master's) can be set against.
        self.wall_offset = wall_offset
        self.finished_at: float | None = None
        self.checkpoints: list[CheckpointRecord] = []
        self.final_model_uri: str | None = None
        self.metrics: dict[str, float] = {}
        self.final_step = 0
        self.resumed_from: str | None = None
        self.prior_generations: list[GenerationSummary] = []
        self.prior_elapsed_s = 0.0
        self.last_step_seen = 0
        self.loss: float | None = None  # the latest step's mean training loss, as trainers report it
        # A checkpoint someone asked for (the launcher, before a cancel): served at the next step.
        self.checkpoint_requested = False
        # Cuts handed out, by (generation, step), until their checkpoint commits: the queue state to restore.
        self.pending_cuts: dict[tuple[int, int], dict[str, Any]] = {}
        self.unschedulable_at: float | None = None  # last time the launcher gave up on Pending trainers
        # Trainers told to stop (preempted, their pod deleted), by id, and when they asked to leave: their
        # replacements wait for the sidecar's next decision (``held_replacements``), which releases them.
        self.told_to_stop: dict[str, float] = {}
        # Trainers told to stop while leaving would take the job below its minimum (``leave``), by id: they
        # train on until a replacement has joined, then are drained; listed until their exits are reported.
        self.replacing: set[str] = set()
        self.sidecar_decides = False  # the autoscale sidecar has set the size (not only ``edl scale``)
        self.node_hints: tuple[str, ...] = ()  # the sidecar's planned node per trainer (not checkpointed)
        self.size_reason: SizeReason | None = None  # why the job is at its size (``JobView.reason``)
        # Each change of the reason's cause, with the job's elapsed time then: the run's story (``summary``).
        self.reasons: list[tuple[float, SizeReason]] = []
        # The launcher's beats; its silence abandons the job (from this master's start: a full timeout).
        self.deadman = DeadMan(spec.launcher_timeout_s, now)
        self.budgets: dict[str, BudgetView] = {}  # the launcher's failure budgets, from its latest beat
        self.highest_trainer_number = 0  # of the ids registered (``JobView.highest_trainer_number``)
        self._control_key: tuple | None = None  # the last ``control_key`` answered, and its count of changes
        self._control_changes = 0
        desired = spec.trainers
        if restored is not None:
            self.queue = TaskQueue.from_state(restored["queue"])
            self.restore_step = int(restored["step"])
            self.restore_source = Source.CHECKPOINT
            self.restore_uri: str | None = restored_uri
            self.resumed_from = restored_uri
            desired = int(restored.get("desired", desired))
            desired = min(max(desired, spec.min_trainers), spec.max_trainers)
            self.prior_generations = [GenerationSummary.from_json(g) for g in restored.get("generations", [])]
            self.prior_elapsed_s = float(restored.get("elapsed_s", 0.0))
            self.checkpoints = [CheckpointRecord.from_json(c) for c in restored.get("checkpoints", [])]
            self.last_step_seen = self.restore_step
        else:
            self.queue = TaskQueue(shards, spec.epochs, spec.task_rows, spec.max_task_failures, spec.seed)
            self.restore_step = 0
            self.restore_source = Source.INIT
            self.restore_uri = None
        # The queue as of the last committed checkpoint (or the start): where a job
        # whose every trainer is gone rolls back to.
        self.restore_queue_state = self.queue.to_state()
        # What a restarted master started from, and where its re-registering trainers say they
        # stopped (``edl.master.resume``): the first generation goes on from there when it can.
        cut = restored.get("cut") if restored is not None else None
        self.restored = Restored(self.restore_step, self.restore_uri, None if cut is None else CutRecord.from_json(cut),
                                 self.restore_queue_state)
        self.resume_reports: dict[str, ResumeReport] = {}
        self.resume_note: str | None = None  # how the first generation of a restarted master was decided
        self.committed_cut: CutRecord | None = None  # the newest checkpoint this master committed
        self.membership = Membership(MembershipConfig(
            spec.min_trainers, spec.max_trainers, desired,
            lease_s=timeouts.lease_s, sync_timeout_s=timeouts.sync_timeout_s, prepare=timeouts.prepare,
        ))
        if restored is not None:
            self.membership.resume_reason = Reason.RESUME

    # ----------------------------------------------------------------- helpers
    @property
    def desired(self) -> int:
        return self.membership.config.desired

    def _fail(self, message: str, now: float, user: bool = False) -> None:
        if self.status is JobStatus.RUNNING:
            self.status = STATUS_TRANSITIONS.move(self.status, JobStatus.FAILED)
            self.error = message
            self.user_error = user
            self.finished_at = now

    def _guard(self, fn, now: float):
        try:
            return fn()
        except PermanentError as e:
            self._fail(str(e), now)
            return None

    # ----------------------------------------------------------- operations
    def launcher_beat(self, now: float, budgets: dict[str, BudgetView] | None = None) -> None:
        self.deadman.beat(now)
        if budgets:
            self.budgets = dict(budgets)

    def launcher(self, now: float) -> LauncherState:
        """The dead-man switch at ``now`` (the first look past the timeout abandons the job)."""
        return self.deadman.state(now)

    @property
    def abandoned(self) -> bool:
        return self.deadman.abandoned

    def scale(self, n: int, nodes: tuple[str, ...] = (), reason: SizeReason | None = None, now: float = 0.0,
              released: tuple[str, ...] | None = None) -> None:
        """Set the desired count and the planned nodes, and why (``None``: by hand, ``edl scale``).
        ``released``: the held trainers (``held_replacements``) the decision saw; ``None``: all of them."""
        lo, hi = self.spec.min_trainers, self.spec.max_trainers
        if not lo <= n <= hi:
            raise UserError(f"--trainers {n} is outside this job's range {lo}..{hi}")
        if len(nodes) > n:
            raise UserError(f"{len(nodes)} node hints for {n} trainers")
        self.membership.config.desired = n
        self.node_hints = tuple(nodes)
        self.sidecar_decides = reason is not None
        # Decided since they left: their replacements wait no longer. Only those the decision saw: one that
        # left while the sidecar decided waits for the next.
        for trainer in list(self.told_to_stop) if released is None else released:
            self.told_to_stop.pop(trainer, None)
        self._explained(reason or SizeReason(SizeCause.FIXED, f"set to {n} by hand (edl scale)"), now)

    def _explained(self, reason: SizeReason, now: float) -> None:
        if self.size_reason is None or self.size_reason.cause is not reason.cause:
            self.reasons = [*self.reasons[-(MAX_REASONS - 1):], (round(self.elapsed_s(now), 3), reason)]
        self.size_reason = reason

    def register(self, trainer: str, pid: int, host: str, store_port: int, now: float,
                 resume: ResumeReport | None = None) -> None:
        m = self.membership
        if resume is not None and m.phase is Phase.FORMING:
            self.resume_reports[trainer] = resume
        old = m.trainers.get(trainer)
        if old is not None:
            if old.state is not TrainerState.WAITING:
                raise UserError(
                    f"trainer id {trainer!r} is already {old.state.value} in job {self.spec.job}; "
                    "a restarted trainer needs a new id"
                )
            old.host, old.pid, old.store_port, old.last_seen = host, pid, store_port, now
            return  # a retried registration
        m.register(trainer, pid, host, store_port, now)
        self.highest_trainer_number = max(self.highest_trainer_number, trainer_number(trainer))
        self.tick(now)

    def heartbeat(self, trainer: str, step: int, safe_cursor: Cursor | None, now: float,
                  loss: float | None = None, generation: int | None = None,
                  in_collective_s: float | None = None, store_port: int | None = None) -> HeartbeatAnswer:
        m = self.membership
        t = m.heartbeat(trainer, step, now, generation, in_collective_s, store_port)
        if t is not None and t.state is TrainerState.ACTIVE and m.phase is Phase.RUNNING:
            if self._in_current(None, generation):  # a cursor sent before a change may name a task handed out again
                self.queue.commit(trainer, safe_cursor)
            if loss is not None and step >= self.last_step_seen:
                self.loss = loss
            self.last_step_seen = max(self.last_step_seen, step)
        # Silence and hangs are the ticker's to find (``tick``): scanning every trainer at every heartbeat
        # would cost the master N x N a second.
        self.tick(now, expire=False)
        return self.heartbeat_answer(trainer)

    def _in_current(self, master_uid: str | None, generation: int | None) -> bool:
        """A trainer's request made in ``generation`` of ``master_uid`` (None: not said) is of the current one."""
        current = self.membership.current
        return ((master_uid is None or master_uid == self.master_uid)
                and (generation is None or (current is not None and generation == current.id)))

    def heartbeat_answer(self, trainer: str) -> HeartbeatAnswer:
        m = self.membership
        t = m.trainers.get(trainer)
        current = m.current.id if m.current else 0
        dropped = m.in_dropped_prepared(trainer)
        return HeartbeatAnswer(
            master_uid=self.master_uid,
            known=t is not None,
            state=t.state if t else None,
            generation=m.current.id if m.current else 0,
            stop=m.change_pending_for(trainer) or self.status is not JobStatus.RUNNING or self.abandoned,
            job_status=self.status,
            checkpoint=self.checkpoint_requested,
            abandoned=self.abandoned,
            committed_cursor=self._committed_cursor(trainer),
            # Its generation failed (or it was dropped, or the prepared generation it switched into was):
            # leave the collective instead of waiting in it.
            abort=m.aborting(trainer) or (t is not None and t.state is TrainerState.FAILED) or dropped,
            abort_through=t.generation if dropped and t is not None else current,
            prepared=self.prepared_view(trainer),
        )

    def prepared_view(self, trainer: str) -> Prepared | None:
        p = self.membership.prepared_for(trainer)
        if p is None:
            return None
        return Prepared(p.id, p.members, p.rendezvous, p.state_to, self.membership.go)

    def prepared_ready(self, trainer: str, generation: int, now: float) -> None:
        self.membership.ready_for(trainer, generation, now)
        self.tick(now)

    def _committed_cursor(self, trainer: str) -> Cursor | None:
        cut, gen = self.committed_cut, self.membership.current
        if cut is None or gen is None or cut.generation != gen.id:
            return None
        return cut.cursors.get(trainer)

    def next_task(self, trainer: str, request_id: str, safe_cursor: Cursor | None, now: float, *,
                  master_uid: str | None = None, generation: int | None = None) -> Task | Next:
        t = self.membership.trainers.get(trainer)
        if t is None or t.state is not TrainerState.ACTIVE:
            return Next.WAIT
        replayed = self.queue.replay(trainer, request_id)
        if replayed is not None:
            # A request asked again (its answer was lost): the same answer, whatever the generation now. Its
            # task is held by the trainer in the master's count, and the trainer asks again with the same id
            # only while its buffer goes on (a switch at a step boundary), never after replacing it.
            return replayed
        if not self._in_current(master_uid, generation):
            # Asked for in a generation that is not the current one (the trainer has not joined the one
            # formed since, or has switched into the next before the others did): a task handed out now
            # would be missing from the assignment it has read, or land in a buffer it is about to replace.
            return Next.WAIT
        if self.membership.phase is Phase.RUNNING:
            self.queue.commit(trainer, safe_cursor)
        answer = self.queue.next_task(trainer, request_id)
        return answer

    def fail_task(self, trainer: str, task_id: int, reason: str, now: float) -> None:
        self._guard(lambda: self.queue.fail_task(trainer, task_id, reason), now)

    def drain(self, trainer: str, now: float, why: str = "drained by the launcher") -> None:
        if trainer not in self.membership.trainers:
            raise UserError(f"no trainer named {trainer!r} in job {self.spec.job}")
        self.membership.drain(trainer, now, why)
        self.tick(now)

    def leave(self, trainer: str, now: float) -> bool:
        """``trainer`` was told to stop (SIGTERM: preempted, its pod deleted, its node drained): drain it. Where
        the sidecar sizes the job, its replacement waits for the sidecar's next decision: a trainer preempted
        for a higher-priority pod has no room to come back to, and a replacement created at once would
        only sit Pending until the launcher gave up on it. Where leaving would take the job below its
        minimum (nobody left to hold the model), it trains on until a replacement has joined (``replacing``),
        then is drained; unless the job is at its maximum too (no room for one to join): drained at once.
        True the first time it asks (it asks again until it has left)."""
        t = self.membership.trainers.get(trainer)
        if t is None:
            raise UserError(f"no trainer named {trainer!r} in job {self.spec.job}")
        if trainer in self.replacing:
            return False
        first = t.state in (TrainerState.WAITING, TrainerState.ACTIVE)  # asked again, or drained
        if (t.state is TrainerState.ACTIVE and self._below_min_without(trainer)
                and len(self.membership.members()) < self.spec.max_trainers):  # room for the replacement
            self.replacing.add(trainer)
            return True
        self.drain(trainer, now, "told to stop (SIGTERM: its pod deleted or preempted)")
        self.told_to_stop = {k: at for k, at in self.told_to_stop.items() if now - at <= REPLACEMENT_HOLD_S}
        if first and self.sidecar_decides:
            self.told_to_stop[trainer] = now
        return first

    def _below_min_without(self, trainer: str) -> bool:
        m = self.membership
        staying = [x for x in m.members()
                   if x != trainer and x not in self.replacing and m.trainers[x].state is TrainerState.ACTIVE]
        return len(staying) < self.spec.min_trainers

    def _release_replaced(self, now: float) -> None:
        """Drain the trainers told to stop at the minimum whose replacements have joined. They stay listed
        until their exits are reported (``trainer_exited``): one that left at the switch is still a live
        process for a moment, which the launcher must not count as one too many (it would drain another)."""
        m = self.membership
        for trainer in sorted(self.replacing):
            t = m.trainers.get(trainer)
            if t is None:
                self.replacing.discard(trainer)
            elif (t.state is TrainerState.ACTIVE and m.phase is Phase.RUNNING and m.prepared is None
                  and not self._below_min_without(trainer)):
                m.drain(trainer, now, "left: its replacement joined")

    def held_replacements(self, now: float) -> tuple[str, ...]:
        """The trainers the launcher does not replace yet (``leave``): until a decision of the sidecar
        releases them, or for ``REPLACEMENT_HOLD_S`` without one (it is away: replace them)."""
        return tuple(sorted(k for k, at in self.told_to_stop.items() if now - at <= REPLACEMENT_HOLD_S))

    def trainer_exited(self, trainer: str, code: int, now: float, preempted: bool = False) -> None:
        """``preempted``: its pod was preempted. One that never joined a generation (killed while it started)
        did not ask to leave (``leave``), yet its place is wanted by a higher-priority pod as much: its
        replacement, too, waits for the sidecar's next decision."""
        self.replacing.discard(trainer)
        m = self.membership
        m.exit_reported(trainer)
        t = m.trainers.get(trainer)
        if preempted and self.sidecar_decides and (t is None or t.state is TrainerState.WAITING):
            self.told_to_stop.setdefault(trainer, now)
        if t is None or t.state.gone:
            return  # already failed or left (silent, dropped): its exit changes nothing
        if t.state is TrainerState.WAITING or (code == 0 and self.queue.finished):
            # Not in a generation, or done with all the data: leaving changes nothing.
            m.move(t, TrainerState.LEFT if code == 0 else TrainerState.FAILED)
            m.exit_reported(trainer)  # it left by ending: nothing of it is still leaving
            return
        if t.state in (TrainerState.ACTIVE, TrainerState.DRAINING):
            m.fail(trainer, now, f"ended (exit {code}{', preempted' if preempted else ''}; seen by the launcher)")
        self.tick(now)

    def sync(self, report: SyncReport, now: float) -> None:
        self.membership.report(report, now)
        self.tick(now)

    def first_step(self, generation: int, now: float) -> None:
        self.membership.first_step(generation, now)

    def fatal(self, message: str, now: float, user: bool = False) -> None:
        self._fail(message, now, user)

    def user_code_failed(self, failure: UserCodeFailure, now: float) -> bool:
        """A trainer's user code raised; ``True`` when that fails the job as a user error
        (``edl.master.usercode``). Once the data is all consumed nothing can redo the work."""
        error = self.user_code.judge(failure, can_retry=not self.queue.finished)
        if error is not None:
            self._fail(error, now, user=True)
        return self.status is JobStatus.FAILED and self.user_error

    def finish(self, step: int, final_model_uri: str | None, metrics: dict, now: float) -> None:
        if self.status is not JobStatus.RUNNING:
            return
        self.final_step = step
        self.last_step_seen = max(self.last_step_seen, step)
        self.final_model_uri = final_model_uri
        self.metrics = dict(metrics)
        self.status = STATUS_TRANSITIONS.move(self.status, JobStatus.SUCCEEDED)
        self.finished_at = now

    # -------------------------------------------------------------- checkpoints
    def checkpoint_cut(self, generation: int, step: int, cursors: dict[str, Cursor | None],
                       now: float) -> dict[str, Any]:
        """The master half of a consistent cut at ``step`` of ``generation`` (fenced: a generation
        that is no longer current gets ``StaleError``)."""
        cur = self.membership.current
        if cur is None or cur.id != generation:
            raise StaleError(f"stale generation {generation}")
        self.checkpoint_requested = False  # this cut serves any pending request
        state = {
            "step": step,
            "queue": self.queue.cut(cursors),
            "desired": self.desired,
            "generations": to_json(self.generation_summaries()),
            "checkpoints": to_json(self.checkpoints),
            "elapsed_s": self.elapsed_s(now),
            "spec": self.spec.to_dict(),
            # Whose cut this is: a restarted master walks its trainers' ledgers from these cursors.
            "cut": CutRecord(self.master_uid, generation, step, dict(cursors)).to_json(),
        }
        self.pending_cuts[(generation, step)] = state
        return state

    def request_checkpoint(self) -> None:
        self.checkpoint_requested = True

    def report_unschedulable(self, count: int, now: float) -> None:
        """Trainer pods the cluster could not place: lower the desired count (not below min) so the
        launcher stops asking, and note when, so that the sidecar holds off growing for a while."""
        if count > 0:
            self.membership.config.desired = max(self.spec.min_trainers, self.desired - count)
            self.unschedulable_at = now
            self._explained(SizeReason(SizeCause.NO_ROOM, f"{count} trainer(s) could not be scheduled: lowered to "
                                                          f"{self.desired}"), now)

    def checkpoint_committed(self, record: CheckpointRecord) -> bool:
        """Rank 0 wrote the checkpoint of a cut. ``False``: no such cut is pending."""
        state = self.pending_cuts.pop((record.generation, record.step), None)
        if state is None:
            return False
        for key in [k for k in self.pending_cuts if k[1] < record.step]:
            self.pending_cuts.pop(key)  # older cuts can never commit now
        self.checkpoints.append(record)
        self.restore_queue_state = state["queue"]
        self.restore_step = record.step
        self.restore_source = Source.CHECKPOINT
        self.restore_uri = record.uri
        if "cut" in state:
            self.committed_cut = CutRecord.from_json(state["cut"])
        return True

    # --------------------------------------------------------------- the clock
    def tick(self, now: float, expire: bool = True) -> Formation | None:
        """Move the job on at ``now``: prepare, form, and with ``expire`` fail the trainers that are silent
        or hold the others up (the master's ticker does that every 0.1 s)."""
        if self.launcher(now) is not LauncherState.WATCHING:
            return None  # abandoned: nothing may re-form while everyone leaves
        if self.status is not JobStatus.RUNNING:
            return None
        m = self.membership
        failed = m.phase is Phase.SYNCING and m.pending_reason is Reason.FAILURE
        if self.queue.finished and not failed:
            # Finishing: rank 0 writes the last checkpoint; nothing may re-form. Except a prepared generation
            # the members switched into at the step that finished the data: they are in it, and its rank 0's
            # last checkpoint and finish name it (stale for ever if it were never formed).
            if not m.switched_in(now):
                return None
        elif self.queue.finished:
            # A member lost while finishing (rank 0 in its last checkpoint, or a last step that failed): the
            # survivors form a generation, get back the rows the lost member had not committed, and finish.
            if expire:
                m.expire(now)
            if not m.ready_to_form(now):
                return None
        else:
            if expire:
                m.expire(now)
            if m.phase is Phase.FORMING and self.resume_reports:
                return self._resume(now)
            self._release_replaced(now)
            m.prepare(now)
            if not m.ready_to_form(now):
                return None
        formation = m.form(now, self.restore_step, self.restore_source)
        if formation.rollback:
            # No survivor holds the model: model and queue go back to the last checkpoint.
            self.queue = TaskQueue.from_state(self.restore_queue_state)
        else:
            for trainer, failed in formation.departed.items():
                cursor = formation.generation.cursors.get(trainer)
                if not self._release(trainer, cursor, failed, now):
                    return formation
            for trainer in formation.generation.members:
                self.queue.commit(trainer, formation.generation.cursors.get(trainer))
        return formation

    def _resume(self, now: float) -> Formation | None:
        """The first generation of a restarted master whose trainers re-registered with where they stopped:
        from their step when every member of their generation is back, else from the checkpoint."""
        m = self.membership
        waiting = [t.id for t in m.waiting()]
        first = m.first_registration_at if m.first_registration_at is not None else now
        reports = {k: r for k, r in self.resume_reports.items() if k in waiting}
        plan = plan_resume(self.restored, reports, waiting, now - first)
        if plan.wait:
            return None
        m.resume_reason = Reason.RESUME
        if plan.rebuild:
            assert plan.queue_state is not None
            self.queue = TaskQueue.from_state(plan.queue_state)
            # Every trainer that reported stopped at ``plan.step`` in one generation: they hold its state.
            formation = m.form(now, plan.step, Source.PEER, lead=plan.lead, triggered_at=first, holders=reports,
                               cause=RESTART_CAUSE)
            self.last_step_seen = max(self.last_step_seen, plan.step)
            self.resume_note = f"going on from the trainers' step {plan.step} (checkpoint at step {self.restore_step})"
            # The next restart should find a checkpoint of this master's generations: its trainers'
            # ledgers reach back only to their own generation.
            self.checkpoint_requested = True
        else:
            if not m.ready_to_form(now):
                return None
            formation = m.form(now, self.restore_step, self.restore_source, triggered_at=first, cause=RESTART_CAUSE)
            self.resume_note = f"back to the checkpoint at step {self.restore_step}: {plan.why}"
        formation.generation.rolled_back_steps = max(0, plan.reported_step - formation.generation.base_step)
        self.resume_reports = {}
        return formation

    def _release(self, trainer: str, cursor: Cursor | None, failed: bool, now: float) -> bool:
        def release() -> bool:
            self.queue.release(trainer, cursor, failed)
            return True

        return self._guard(release, now) is True

    # ------------------------------------------------------------------ views
    def assignment(self, trainer: str) -> Assignment | None:
        gen = self.membership.current
        if gen is None:
            return None
        rank = gen.rank_of(trainer)
        if rank is None:
            return None
        return Assignment(
            generation=gen.id,
            rank=rank,
            world_size=gen.world_size,
            members=gen.members,
            rendezvous=gen.rendezvous,
            base_step=gen.base_step,
            source=gen.source,
            checkpoint_uri=self.restore_uri if gen.source is Source.CHECKPOINT else None,
            cursor=gen.cursors.get(trainer),
            held=tuple(self.queue.held_by(trainer)),
            held_offset=self.queue.held[trainer].offset if trainer in self.queue.held else 0,
            master_uid=self.master_uid,
            state_to=gen.state_to,
        )

    def assignment_answer(self, trainer: str, after: int) -> Assignment | Prepared | NoAssignment:
        """What a trainer that is in generation ``after`` (0: none) should do next."""
        if self.abandoned:
            return NoAssignment(Unassigned.ABANDONED)
        if self.status is not JobStatus.RUNNING:
            return NoAssignment(Unassigned.FINISHED, job_status=self.status)
        t = self.membership.trainers.get(trainer)
        if t is None:
            return NoAssignment(Unassigned.UNKNOWN, master_uid=self.master_uid)
        if t.state is TrainerState.LEFT:
            return NoAssignment(Unassigned.LEFT)
        if t.state is TrainerState.FAILED:
            return NoAssignment(Unassigned.FAILED)
        prepared = self.prepared_view(trainer)
        if t.state is TrainerState.WAITING and prepared is not None and prepared.generation > after:
            return prepared  # a joiner: form its collective in the background of the others' training
        a = self.assignment(trainer)
        if a is None or a.generation <= after:
            return NoAssignment(Unassigned.WAIT)
        return a

    def elapsed_s(self, now: float) -> float:
        end = self.finished_at if self.finished_at is not None else now
        return self.prior_elapsed_s + (end - self.started_at)

    def generation_summaries(self) -> list[GenerationSummary]:
        out = list(self.prior_generations)
        for g in self.membership.history:
            out.append(GenerationSummary(
                id=len(out) + 1,
                master_generation=g.id,
                world_size=g.world_size,
                members=g.members,
                reason=g.reason,
                source=g.source,
                base_step=g.base_step,
                pause_s=None if g.pause_s is None else round(g.pause_s, 3),
                triggered_at=g.triggered_at,
                first_step_at=g.first_step_at,
                rolled_back_steps=g.rolled_back_steps,
                prepared_s=None if g.prepared_s is None else round(g.prepared_s, 3),
                stopped_at=g.stopped_at,
                formed_at=g.formed_at,
                cause=g.cause,
                wall_at=round(g.triggered_at + self.wall_offset, 3),
            ))
        return out

    def control_key(self) -> tuple:
        """What the launcher acts on or reports as an event, from the status: the job's outcome, the
        membership's phase and generation, the desired count and planned nodes, the trainers it knows,
        the epochs done, checkpoints, and whether the newest generation's pause is known. The launcher's
        long poll of the status returns when this changes. Not the step, the loss or the rows done:
        they change every step, and the launcher only shows them."""
        m = self.membership
        gen = m.current
        return (self.master_uid, self.status, self.error, self.user_error, self.abandoned, m.phase,
                gen.id if gen else 0, gen.world_size if gen else 0, self.desired, self.node_hints,
                self.size_reason.cause if self.size_reason else None, tuple(self.told_to_stop),
                tuple(sorted(self.replacing)), self.unschedulable_at, self.queue.epochs_completed,
                len(self.checkpoints), len(m.history),
                bool(m.history) and m.history[-1].pause_s is not None,
                tuple((t.id, t.state) for t in m.trainers.values() if not t.state.gone))

    def revision(self) -> tuple:
        """Changes whenever anything a long poll waits on changes (a trainer's heartbeat news, its
        assignment, ``control_key``), and not on a heartbeat that only moves steps, cursors and the loss.
        O(1), unlike ``control_key``: the master compares it after every request and tick."""
        cause = self.size_reason.cause if self.size_reason else None
        return (self.status, self.abandoned, self.desired, self.node_hints, cause, tuple(self.told_to_stop),
                tuple(sorted(self.replacing)), self.unschedulable_at, self.queue.epochs_completed, len(self.checkpoints),
                self.membership.revision())

    def beat_revision(self) -> tuple:
        """Changes whenever a trainer's heartbeat news (``HeartbeatAnswer``'s stop, abort, prepared
        generation and go) may have changed: the membership, the job's status. Not when an epoch ends, a
        checkpoint is committed or the launcher's wanted size moves, which wake only the other polls (at
        1,024 trainers each such wake had the master look at every waiting heartbeat: 30-80 ms)."""
        return self.status, self.abandoned, self.membership.revision()

    def control_version(self) -> int:
        """How often ``control_key`` has changed, as far as anyone asked (``JobView.control_version``):
        each answer that differs from the one before counts one more."""
        key = self.control_key()
        if key != self._control_key:
            self._control_key, self._control_changes = key, self._control_changes + 1
        return self._control_changes

    def status_view(self, now: float) -> JobView:
        m = self.membership
        gen = m.current
        q = self.queue
        return JobView(
            job=self.spec.job,
            status=self.status,
            error=self.error,
            master_uid=self.master_uid,
            phase=m.phase,
            generation=gen.id if gen else 0,
            world_size=gen.world_size if gen else 0,
            desired_trainers=self.desired,
            node_hints=self.node_hints,
            held_replacements=self.held_replacements(now),
            replacing=tuple(sorted(self.replacing)),
            unschedulable_at=self.unschedulable_at,
            min_trainers=self.spec.min_trainers,
            max_trainers=self.spec.max_trainers,
            epoch=min(q.current_epoch, self.spec.epochs - 1),
            epochs=self.spec.epochs,
            epochs_completed=q.epochs_completed,
            rows_per_epoch=q.rows_per_epoch,
            done_rows=tuple(q.done_rows.get(e, 0) for e in range(self.spec.epochs)),
            step=self.last_step_seen,
            loss=self.loss,
            trainers=tuple(
                TrainerView(t.id, gen.rank_of(t.id) if gen else None, t.pid, t.state, t.step)
                for t in m.trainers.values()
                if not t.state.gone
            ),
            generations=tuple(self.generation_summaries()),
            checkpoints=tuple(self.checkpoints),
            elapsed_s=round(self.elapsed_s(now), 3),
            abandoned=self.abandoned,
            user_error=self.user_error,
            control_version=self.control_version(),
            reason=self.size_reason,
            budgets=dict(self.budgets),
            highest_trainer_number=self.highest_trainer_number,
            departing=tuple(m.departing),
        )

    def summary(self, now: float) -> dict[str, Any]:
        """The run summary (``/v1/summary``): a JSON document that launchers extend and write."""
        elapsed = self.elapsed_s(now)
        q = self.queue
        samples = sum(q.done_rows.values())
        return {
            "job": self.spec.job,
            "status": self.status.value,
            "error": self.error,
            "user_error": self.user_error,
            "epochs_completed": q.epochs_completed,
            "steps": max(self.final_step, self.last_step_seen),
            "elapsed_s": round(elapsed, 3),
            "throughput_samples_per_s": round(samples / elapsed, 2) if elapsed > 0 else 0.0,
            "samples_per_epoch": [q.done_rows.get(e, 0) for e in range(self.spec.epochs)],
            "lost_samples": None,
            "duplicate_samples": None,
            "generations": [
                {"id": g.id, "world_size": g.world_size, "reason": g.reason.value, "pause_s": g.pause_s,
                 "rolled_back_steps": g.rolled_back_steps, "base_step": g.base_step, "prepared_s": g.prepared_s,
                 "source": g.source.value, "cause": g.cause, "wall_at": g.wall_at, "chain": g.chain()}
                for g in self.generation_summaries()
            ],
            "checkpoints": [{"step": c.step, "uri": c.uri, "write_s": round(c.write_s, 3)} for c in self.checkpoints],
            # Why the job was at its size, each change of cause at the job's elapsed time ``t``.
            "size_reasons": [{"t": t, **r.to_json()} for t, r in self.reasons],
            "resumed_from": self.resumed_from,
            "final_model_uri": self.final_model_uri,
            "metrics": self.metrics,
        }
