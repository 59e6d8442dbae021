"""``edl trainer``: one elastic data-parallel worker (PaddlePaddle or PyTorch, ``edl.api.framework``).

The loop, per generation: get the assignment from the master, form the
collective in-process, take model state from rank 0 (its replica, the
checkpoint, or a fresh seeded init), then step. Each step's all-reduce carries
the gradients *and* one slot per rank with its data cursor, sample count, loss
sum, two flags (stop, finished) and the prepared generation it is ready to
switch into. So every rank that completes a step knows every rank's position at
that step, and all ranks agree, through the collective itself, on the step at
which a generation ends (``edl.trainer.decide``). A graceful change does not
stop: its generation is prepared while this one trains (``edl.trainer.prepared``)
and every rank switches into it after the same step, its group already formed.

Beside the loop run the heartbeat (``edl.trainer.heartbeat``) and the prefetch
(``edl.trainer.prefetch``); the model is the framework's replica (``edl.frameworks``),
rank 0's checkpoints the checkpointer's (``edl.trainer.checkpoints``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
import zlib
from pathlib import Path
from dataclasses import dataclass
from typing import Callable

from edl.api.data import Cursor, Task
from edl.api.framework import Framework, Group
from edl.api.master import (
    Assignment,
    HeartbeatAnswer,
    NO_STATE,
    JobStatus,
    Prepared,
    ResumeReport,
    Source,
    SyncReport,
    TrainerLink,
    Unassigned,
    UserCodeFailure,
)
from edl.api.spec import JobSpec
from edl.data.dataset import Dataset
from edl.errors import Abandoned, CollectiveError, EdlError, TemporaryError, UserCodeError, UserError
from edl.frameworks import framework_of, load
from edl.masterlink import HttpMaster, MasterUnavailable
from edl.modeldef import ModelDef
from edl.net import port_to_keep
from edl.procs import leave_process
from edl.storage.audit import AUDIT_SPOOL_ENV, audit_spool
from edl.storage.checkpoint import FINAL, CheckpointStore
from edl.storage.modelsource import read_model_def
from edl.storage.store import ObjectStore, open_store
from edl.trainer.audit import AuditLog
from edl.trainer.checkpoints import Checkpointer
from edl.trainer.collective import Runner
from edl.trainer.data import Slice, TaskBuffer, read_slices, record_ids
from edl.trainer.decide import CheckpointWhy, StepContext, StepDecision, Then, decide_step, plan_start
from edl.trainer.export import evaluate, export_model, read_warm_start
from edl.trainer.heartbeat import COLLECTIVE_DEADLINE_S, MASTER_LOST_S, Control, Heartbeat, master_lost_after_s
from edl.trainer.leaving import Leaving
from edl.trainer.prefetch import Prefetcher
from edl.trainer.prepared import Preparation
from edl.trainer.progress import Progress
from edl.trainer.slots import SLOT, StepSums, decode_sums, own_slots

log = logging.getLogger("edl.trainer")

EXIT_OK, EXIT_FAILED, EXIT_EXCLUDED = 0, 1, 3
# A joiner waits this long at most for a prepared generation's go: past the master's preparation timeout,
# by when it has either given the go or dropped the preparation.
PREPARED_WAIT_S = 30.0


@dataclass(frozen=True)
class Links:
    """The trainer's links to its master, one per patience: how long each call waits out a master that is away."""

    loop: TrainerLink  # the loop's calls: retried while the master restarts
    once: TrainerLink  # reports that may be lost (tried once)
    joining: TrainerLink  # registering: waits as long as a trainer ever waits for its master
    prepare: TrainerLink  # the preparation thread's
    heartbeat: TrainerLink
    prefetch: TrainerLink
    leaving: TrainerLink  # told to stop: asks the master to drain it (once: a master away is a job torn down)
    checkpoints: Callable[[], TrainerLink]  # opened on the checkpoint writer's thread

    @classmethod
    def http(cls, master: str, token: str, master_lost_s: float) -> Links:
        return cls(loop=HttpMaster(master, token), once=HttpMaster(master, token, give_up_s=0.0),
                   joining=HttpMaster(master, token, give_up_s=master_lost_s),
                   prepare=HttpMaster(master, token, give_up_s=5.0),
                   heartbeat=HttpMaster(master, token, timeout_s=10, give_up_s=0.0),
                   prefetch=HttpMaster(master, token, timeout_s=10, give_up_s=0.0),
                   leaving=HttpMaster(master, token, timeout_s=2, give_up_s=0.0),
                   checkpoints=lambda: HttpMaster(master, token, give_up_s=120))


class Trainer:
    """One trainer's loop. Its parts come from the caller (``build_trainer`` puts the real ones together):
    the job's spec, the model definition and its framework, the links to the master, the data set and
    the job's store."""

    def __init__(self, trainer_id: str, host: str, spec: JobSpec, md: ModelDef, framework: Framework, links: Links,
                 dataset: Dataset, job_store: ObjectStore, *, master_addr: str = "", backend: str = "gloo",
                 collective_deadline_s: float = COLLECTIVE_DEADLINE_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, exit_process: Callable[[int], None] | None = None,
                 audit_spool: ObjectStore | None = None) -> None:
        exit_process = exit_process or leave_process  # at once: see ``edl.cli.processes.cmd_trainer``
        self.id = trainer_id
        self.master_addr = master_addr
        self.host = host
        self.backend = backend
        self.clock = clock
        self.sleep = sleep
        self.spec = spec
        self.master_lost_s = master_lost_after_s(spec.launcher_timeout_s)
        self.client = links.loop
        self.client_once = links.once
        self.client_joining = links.joining
        self.client_prepare = links.prepare  # the preparation thread's
        self.md = md
        self.framework = framework
        warm = read_warm_start(spec.init_model) if spec.init_model else None
        self.replica = framework.replica(md, spec.seed, spec.learning_rate, warm)
        self.dataset = dataset
        ckpts = CheckpointStore(job_store, spec.keep_checkpoints)
        self.checkpoints = Checkpointer(ckpts, links.checkpoints, trainer_id, spec.model_def, clock)
        self.progress = Progress()
        self.control = Control()
        self.prefetch = Prefetcher(links.prefetch, trainer_id, TaskBuffer(), spec.batch_size, self.progress,
                                   warm=self._read_ahead)
        self.heartbeat = Heartbeat(links.heartbeat, trainer_id, self.progress, self.control,
                                   on_stuck=lambda: exit_process(EXIT_EXCLUDED), deadline_s=collective_deadline_s,
                                   clock=clock,
                                   # Nobody is left to replace it or wait for it: end cleanly.
                                   on_master_lost=lambda: exit_process(EXIT_OK), master_lost_s=self.master_lost_s,
                                   on_answer=self._on_answer)
        self.progress.store_port = port_to_keep(host)
        # The next generation of a graceful change, its group formed on a thread of its own.
        self.preparation = Preparation(trainer_id, self._form_prepared)
        self.runner = Runner()  # the collectives run there, so that an aborted generation is left at once
        # Under the checkpoints; ``audit_spool``: where records wait while the store is away (a local job).
        self.audit = AuditLog(job_store, trainer_id, spool=audit_spool) if spec.audit else None
        self.leaving = Leaving(trainer_id, links.leaving, exit_process)  # its SIGTERM handler (``run_trainer``)
        self._alive = True
        self.flush_s = 60.0  # how long the end waits for rank 0's last checkpoint write
        # Where this trainer last stopped, for a restarted master to go on from (``ResumeReport``).
        self.stopped: tuple[Assignment, int, dict[str, Cursor | None]] | None = None

    def _on_answer(self, answer: HeartbeatAnswer) -> None:
        """What the loop keeps from a heartbeat answer besides ``Control``'s: a committed checkpoint of our
        generation (our task ledger need not reach back before it), and the prepared generation (a member
        of the current one prepares it here; a joiner does in its loop)."""
        self.prefetch.buffer.forget_before((answer.master_uid, answer.generation), answer.committed_cursor)
        if answer.master_uid == self.control.master_uid and self.progress.generation != 0:
            self.preparation.update(answer.prepared)

    def _form_prepared(self, prepared: Prepared) -> Group:
        """On the preparation's thread: form the prepared generation's group, and tell the master."""
        group = self._form_group(prepared.generation, prepared.rendezvous, prepared.members.index(self.id),
                                 len(prepared.members))
        try:
            self.client_prepare.prepared_ready(self.id, prepared.generation)
        except EdlError:
            group.close()
            raise
        return group

    def _form_group(self, generation: int, rendezvous: tuple[str, int], rank: int, world: int) -> Group:
        """A generation's group; rank 0 hosts its store on the port it advertised, so it advertises another."""
        host, port = rendezvous
        if rank == 0:
            self.progress.store_port = port_to_keep(self.host)
        group_id = zlib.crc32(f"{self.control.master_uid}:{generation}".encode()) & 0x7FFFFFFF
        return self.framework.group(host, port, rank, world, group_id, self.backend)

    def _read_ahead(self, task: Task) -> None:
        """The prefetch reads a new task's row groups while the loop trains on the ones before."""
        try:
            self.dataset.warm(task.shard, task.start, task.end)
        except EdlError as e:  # the loop reads these rows again and reports what is wrong
            log.debug("reading ahead %s: %s", task.describe(), e)

    def _warm_up(self) -> None:
        """Before registering, so that the framework's first-call costs are not paid inside the generation change."""
        shard = self.dataset.shards()[0]
        x, y = self.md.collate(self.dataset.rows(shard.name, 0, min(shard.rows, self.spec.batch_size)))
        self.replica.warm_up(x, y)

    def run(self) -> int:
        self._warm_up()
        r = self.client_joining.register(self.id, os.getpid(), self.host, self.progress.store_port)
        self.control.reset(r.master_uid)
        self.leaving.registered = True
        log.info("trainer %s registered with master %s", self.id, self.master_addr)
        for name, loop in (("edl-heartbeat", self.heartbeat.run), ("edl-prefetch", self.prefetch.run)):
            threading.Thread(target=loop, args=(lambda: self._alive,), name=name, daemon=True).start()
        after = 0  # a prepared generation we could not join: what comes next is newer
        try:
            while True:
                a = self.client.assignment(self.id, after=max(after, self.progress.generation), wait_s=10.0)
                if isinstance(a, Assignment):
                    if self._run_generation(a):
                        return EXIT_OK
                    continue
                if isinstance(a, Prepared):  # we join a graceful change's generation
                    joined = self._join_prepared(a)
                    if joined is None:
                        after = a.generation
                    elif self._run(*joined):
                        return EXIT_OK
                    continue
                match a.why:
                    case Unassigned.WAIT:
                        continue  # no newer generation yet
                    case Unassigned.UNKNOWN:
                        self._reregister()
                        after = 0  # the new master numbers its generations from 1 again
                    case Unassigned.FINISHED:
                        return EXIT_OK if a.job_status is JobStatus.SUCCEEDED else EXIT_FAILED
                    case Unassigned.LEFT:
                        log.info("trainer %s drained; leaving", self.id)
                        return EXIT_OK
                    case Unassigned.FAILED:
                        why = " (it stopped responding while the others waited on it)" if self.control.dropped else ""
                        log.warning("trainer %s was dropped from the job%s; leaving", self.id, why)
                        return EXIT_EXCLUDED
                    case Unassigned.ABANDONED:
                        log.warning("trainer %s: the job's launcher went silent and the master ends the job; "
                                    "leaving", self.id)
                        self.flush_s = 5.0  # the master exits shortly: do not outwait it
                        return EXIT_OK
        finally:
            self._alive = False
            self.leaving.ended.set()
            self.checkpoints.flush(self.flush_s)

    def _reregister(self) -> None:
        """The master restarted and lost us: join it afresh, telling it where we stopped (our replica
        stays as it is: the new master may go on from its step)."""
        self.progress.store_port = port_to_keep(self.host)
        self.progress.generation = 0
        self.progress.safe_cursor = None  # a cursor of the old master's tasks means nothing to the new one
        self.preparation.reset()  # the new master's generations start at 1 again
        resume = self._resume_report()
        self.prefetch.restart()
        r = self.client.register(self.id, os.getpid(), self.host, self.progress.store_port, resume)
        self.control.reset(r.master_uid)
        log.info("trainer %s re-registered with restarted master%s", self.id,
                 "" if resume is None else f" (stopped at step {resume.step} of generation {resume.generation})")

    def _resume_report(self) -> ResumeReport | None:
        if self.stopped is None or self.stopped[1] != self.progress.step:
            return None  # never stopped at a step boundary, or stepped since: nothing to go on from
        a, step, cursors = self.stopped
        ledger = self.prefetch.buffer.ledger()
        if ledger.key != (a.master_uid, a.generation):
            return None
        return ResumeReport(a.master_uid, a.generation, a.base_step, a.source, a.checkpoint_uri, step, a.members,
                            dict(cursors), ledger.tasks, ledger.start, ledger.offset)

    # ------------------------------------------------------------ one generation
    def _run_generation(self, a: Assignment) -> bool:
        """Join generation ``a`` and train in it until it ends; ``True`` when training is done."""
        return self._run(a, self._join(a))

    def _run(self, a: Assignment, group: Group | None) -> bool:
        """Train in generation ``a`` and in the prepared ones it switches into; ``True`` when training is done."""
        while group is not None:
            end = self._train(a, group)
            if isinstance(end, bool):
                return end
            a, group = end
        return False

    def _join(self, a: Assignment) -> Group | None:
        """Form the generation's collective and take rank 0's state; ``None`` when it did not form (reported)."""
        plan = plan_start(a.source, a.rank, a.base_step, self.replica.trained)
        self.stopped = None
        p = self.progress
        key = (a.master_uid, a.generation)
        if plan.keep_data:
            self.prefetch.buffer.reposition(a.cursor, list(a.held), a.held_offset, key)
            self.prefetch.pace.restart()  # the pause between the generations is not the loop's pace
        else:
            p.safe_cursor = None  # the old tasks are gone: committing a cursor into them would be wrong
            self.prefetch.restart(key)
        p.generation = a.generation
        host, port = a.rendezvous
        t0 = self.clock()

        def abort() -> bool:
            return self.control.aborts(a.generation)

        try:
            p.in_collective_since = self.clock()
            group = self.runner.run(lambda: self._form_group(a.generation, (host, port), a.rank, a.world_size), abort)
            if plan.rebuild:
                self.replica.build()
            if plan.load_checkpoint:
                assert a.checkpoint_uri is not None  # Source.CHECKPOINT names it
                p.step = self._load_checkpoint(a.checkpoint_uri)
            elif plan.step is not None:
                p.step = plan.step
            t1 = self.clock()
            own_step = p.step if a.rank == 0 else a.base_step
            if a.state_to:
                p.step = self.runner.run(lambda: self.replica.broadcast(group, own_step), abort, group)
            else:  # every member stopped at the base step of one generation: nothing to send
                p.step = own_step
            t2 = self.clock()
        except CollectiveError as e:
            log.warning("trainer %s: generation %d did not form: %s", self.id, a.generation, e)
            # Only a member that held the generation's state from the start (it stopped at its base step
            # in the one before) may offer its replica to the next; one that was to load or receive it
            # holds some older state, whatever its step says.
            holds = a.source is Source.PEER and a.rank not in a.state_to and p.step == a.base_step
            self._report(a.generation, p.step if holds else NO_STATE, {}, failed=True)
            return None
        log.info("trainer %s: generation %d, rank %d of %d, step %d (group formed in %.3f s, state in %.3f s%s)",
                 self.id, a.generation, a.rank, a.world_size, p.step, t1 - t0, t2 - t1,
                 f" to ranks {list(a.state_to)}" if a.state_to else ": every member holds it")
        return group

    def _join_prepared(self, prepared: Prepared) -> tuple[Assignment, Group] | None:
        """A joiner's way into a graceful change's generation: form its group while the others train, tell
        the master, and once it gives the go take rank 0's state as the others switch. ``None``: the
        master dropped the preparation (the next one, or the next generation, comes as usual)."""
        gen, rank, world = prepared.generation, prepared.members.index(self.id), len(prepared.members)
        uid = self.control.master_uid
        assert uid is not None
        heard = False  # our heartbeat told us of it too (the assignment may come first)
        deadline = self.clock() + PREPARED_WAIT_S

        def dropped() -> bool:
            nonlocal heard
            p = self.control.prepared
            heard = heard or (p is not None and p.generation == gen)
            # A restarted master never gives the go for its predecessor's generation: re-register at once.
            return (self.control.aborts(gen) or self.control.dropped or self.control.superseded(gen)
                    or self.control.master_changed or (heard and self.control.prepared_dropped(gen))
                    or self.clock() > deadline)

        self.prefetch.buffer.reposition(None, [], 0, (uid, gen))  # a joiner holds nothing yet
        t0 = self.clock()
        try:
            group = self.runner.run(lambda: self._form_group(gen, prepared.rendezvous, rank, world), dropped)
            self.client.prepared_ready(self.id, gen)
            t1 = self.clock()
            while not self.control.go(gen):  # the others switch at their next step after the go
                if dropped():
                    raise Abandoned(f"the master dropped prepared generation {gen}")
                self.sleep(0.005)
            self.progress.generation = gen
            step = self.runner.run(lambda: self.replica.broadcast(group, 0), dropped, group)
        except CollectiveError as e:
            log.info("trainer %s: not joining generation %d: %s", self.id, gen, e)
            self.progress.generation = 0  # in none: a heartbeat naming a dropped one is answered at once
            return None
        self.progress.step = step
        log.info("trainer %s: generation %d, rank %d of %d, step %d (prepared: group formed in %.3f s, "
                 "state in %.3f s after the switch)", self.id, gen, rank, world, step, t1 - t0, self.clock() - t1)
        return Assignment(gen, rank, world, prepared.members, prepared.rendezvous, step, Source.PEER, None, None, (),
                          0, uid, prepared.state_to), group

    def _switch(self, a: Assignment, generation: int, cursors: dict[str, Cursor | None]) -> tuple[Assignment, Group] | None:
        """Every rank is ready for the prepared ``generation`` after this step: report the step on the way
        and go on in it with its group, formed already (rank 0 sends its state to the joiners). ``None``:
        we leave here (drained), or its start failed (reported; the master forms the next one)."""
        p, step = self.progress, self.progress.step
        prepared, group = self.preparation.take(generation)
        self._report(a.generation, step, cursors, failed=False, switched_to=generation)
        if group is None:
            self.stopped = (a, step, cursors)
            return None  # drained: the master releases the rest of our tasks from our cursor here
        self.stopped = None
        rank = prepared.members.index(self.id)
        p.generation = generation
        self.prefetch.buffer.rekey((a.master_uid, generation))
        t0 = self.clock()
        if prepared.state_to:
            p.in_collective_since = t0
            try:
                self.runner.run(lambda: self.replica.broadcast(group, step), lambda: self.control.aborts(generation),
                                group)
            except CollectiveError as e:
                log.warning("trainer %s: generation %d did not start: %s", self.id, generation, e)
                self._report(generation, step, {}, failed=True)
                p.generation = a.generation  # where it stopped; the master forms the next one from its report
                return None
        log.info("trainer %s: generation %d, rank %d of %d, step %d (switched into at the step; state in %.3f s%s)",
                 self.id, generation, rank, len(prepared.members), step, self.clock() - t0,
                 f" to ranks {list(prepared.state_to)}" if prepared.state_to else ": every member holds it")
        return Assignment(generation, rank, len(prepared.members), prepared.members, prepared.rendezvous, step,
                          Source.PEER, None, cursors.get(self.id), (), 0, a.master_uid, prepared.state_to), group

    def _train(self, a: Assignment, group: Group) -> bool | tuple[Assignment, Group]:
        """Step until the generation ends; ``True`` when training is done, or the prepared generation switched
        into (its assignment and group)."""
        gen, p = a.generation, self.progress
        key = (int(a.master_uid), gen)
        if self.audit:
            self.audit.generation(key, p.step)
        cursors: dict[str, Cursor | None] = {m: None for m in a.members}
        if a.cursor is not None:
            cursors[self.id] = a.cursor
        first_step_pending = True
        prev_own = self.prefetch.buffer.cursor
        while True:
            sums = self._step(a, group, key)
            if sums is None:
                self.stopped = (a, p.step, cursors)
                self.replica.drop_grads()  # partly summed: the step is redone in the next generation
                self._report(gen, p.step, cursors, failed=True)
                return False
            d = decide_step(sums, StepContext(a.rank, p.step, first_step_pending, self.checkpoints.since_last_s(),
                                              self.spec.checkpoint_interval_s, self.control.checkpoint_requested))
            self._apply(d, sums.samples)
            # Cursors of every rank at this step; our own at the previous step is now safe
            # to commit (any rank finishing step s implies every rank finished s-1).
            p.safe_cursor = prev_own
            cursors = sums.cursors
            prev_own = cursors[self.id]
            if d.report_first_step:
                first_step_pending = False  # the generation's first completed training step ends its pause
            self._rank0_duties(d, gen, cursors)
            if d.idle:
                self.sleep(0.02)  # nobody had data this step: don't spin
            if d.then is Then.FINISH:
                p.safe_cursor = prev_own
                if d.lead:
                    self._finish(gen, cursors)
                return True
            if d.then is Then.STOP:
                self.stopped = (a, p.step, cursors)
                self._report(gen, p.step, cursors, failed=False)
                return False
            if d.then is Then.SWITCH:
                return self._switch(a, sums.switch_to, cursors) or False

    def _step(self, a: Assignment, group: Group, key: tuple[int, int]) -> StepSums | None:
        """Our next batch's gradients, summed with everyone's; ``None`` when the collective failed."""
        buffer = self.prefetch.buffer
        slices = buffer.take(self.spec.batch_size)
        out_of_data = not slices and self.prefetch.out_of_data()
        # Backward hands each finished gradient bucket to the collectives' thread as it goes, and stops
        # early (where the framework can) once the generation failed: its step is redone in the next one.
        abort = lambda: self.control.aborts(a.generation)  # noqa: E731
        self.replica.begin_step(group, a.world_size * SLOT, self.runner.submit, abort)
        try:
            count, loss_sum = self._backward(slices, key) if slices else (0, 0.0)
        except UserCodeError as e:
            e.step = self.progress.step + 1  # the step it was computing, and its rows: what a replacement redoes
            e.rows = tuple((s.task.shard, s.start, s.end) for s in slices)
            raise
        except Abandoned as e:
            self.runner.abandon(group)  # the buckets sent so far: their sums can no longer complete
            log.warning("trainer %s: step %d failed: %s", self.id, self.progress.step + 1, e)
            return None
        # Read the stop request as late as possible: it rides in this step's all-reduce.
        slots = own_slots(a.world_size, a.rank, buffer.cursor, count, loss_sum, self.control.stops(a.generation),
                          out_of_data, self.preparation.switch_to())
        self.progress.in_collective_since = self.clock()
        try:
            if abort():
                group.abandon()  # the buckets sent during backward are left to their thread
            summed = self.runner.wait(self.replica.reduce_rest(group, slots, self.runner.submit), abort, group)
            sums = decode_sums(summed, a.members)
        except CollectiveError as e:
            log.warning("trainer %s: step %d failed: %s", self.id, self.progress.step + 1, e)
            return None
        self.progress.in_collective_since = None
        return sums

    def _apply(self, d: StepDecision, samples: int) -> None:
        """The step's update (none when nobody had data); a loss that is not finite ends the job."""
        if d.then is Then.ABORT:
            if d.lead:
                assert d.error is not None  # an abort says why
                self.client.fail_job(d.error)
            raise SystemExit(EXIT_FAILED)
        if d.update:
            self.progress.loss = d.mean_loss
        self.replica.end_step(samples)
        if d.update:
            self.progress.step += 1  # a round in which nobody had data leaves the model as it was

    def _rank0_duties(self, d: StepDecision, gen: int, cursors: dict[str, Cursor | None]) -> None:
        if d.report_first_step:
            try:
                self.client_once.first_step(self.id, gen)
            except TemporaryError:
                pass  # the master is away: this generation's pause goes unmeasured
        if d.checkpoint is not None:
            if d.checkpoint is CheckpointWhy.REQUESTED:
                self.control.take_checkpoint_request()
            self._checkpoint(gen, cursors)

    def _backward(self, slices: list[Slice], key: tuple[int, int]) -> tuple[int, float]:
        """Gradients of the rows in ``slices``; answers (rows, loss sum)."""
        try:
            table = read_slices(self.dataset, slices)
        except UserError as e:
            # Unreadable rows: give the task back (counted) and leave; the job retries it.
            self.client.task_failed(self.id, slices[0].task.id, str(e))
            raise
        x, y = self.md.collate(table)
        if self.audit:
            self.audit.step(key, self.progress.step + 1, record_ids(self.dataset, slices))
        return len(y), self.replica.backward(x, y)

    def _report(self, gen: int, step: int, cursors: dict[str, Cursor | None], failed: bool,
                switched_to: int = 0) -> None:
        self.progress.in_collective_since = None
        self.progress.store_port = port_to_keep(self.host)  # a fresh port per generation: the old store may linger
        self.client.sync(SyncReport(self.id, gen, step, cursors, self.progress.store_port, failed, switched_to))

    # ------------------------------------------------------------ checkpoints and the end
    def _checkpoint(self, gen: int, cursors: dict[str, Cursor | None], wait: bool = False) -> None:
        # A periodic cut is tried once (the master may be restarting: training goes on, the next interval
        # tries again); the last one, which the job's end waits for, with retries.
        self.checkpoints.save(gen, self.progress.step, cursors, self.replica.snapshot,
                              self.client if wait else self.client_once, wait)

    def _load_checkpoint(self, uri: str) -> int:
        ckpt = self.checkpoints.read(uri)
        try:
            self.replica.restore(ckpt.params, ckpt.opt_arrays, ckpt.opt_extra)
        except ValueError as e:
            raise UserError(f"checkpoint {ckpt.uri} does not match --model-def {self.spec.model_def}: {e}") from e
        log.info("trainer %s: loaded %s (step %d)", self.id, ckpt.uri, ckpt.step)
        return ckpt.step

    def _finish(self, gen: int, cursors: dict[str, Cursor | None]) -> None:
        """Rank 0, training done: a last checkpoint, the exported model, its held-out metrics."""
        step = self.progress.step
        self._checkpoint(gen, cursors, wait=True)
        store = self.checkpoints.ckpts.store
        final_uri = export_model(self.replica, store)
        metrics: dict[str, float] = {}
        if self.spec.eval_data:
            metrics = evaluate(self.md, self.replica, Dataset(self.spec.eval_data, "--eval-data").read_all()).metrics
        store.put(FINAL, json.dumps({"step": step, "final_model_uri": final_uri, "metrics": metrics}).encode())
        self.client.finish(step, final_uri, metrics)
        log.info("trainer %s: training finished at step %d; metrics %s", self.id, step, metrics)


def _user_code_failed(trainer_id: str, master: str, token: str, e: UserCodeError) -> UserError | UserCodeError:
    """The user's code raised: its traceback into this trainer's log, one report to the master, which
    judges (``edl.master.usercode``). Answers what to exit with: a ``UserError`` (exit 2) when the
    master failed the job as the user's fault, else ``e`` itself (exit 1: relaunched as a crash)."""
    log.error("trainer %s: %s", trainer_id, e, exc_info=e.cause)
    where = os.environ.get("EDL_TRAINER_LOG") or f"the log of trainer {trainer_id}"
    try:
        error = HttpMaster(master, token, give_up_s=10.0).user_code_failed(
            UserCodeFailure(trainer_id, e.step, e.part, e.fingerprint, where, e.rows))
    except (TemporaryError, UserError) as why:
        log.warning("trainer %s: could not report the failure (%s); exiting as a crash", trainer_id, why)
        return e
    return UserError(error) if error is not None else e


def build_trainer(trainer_id: str, master: str, token: str, host: str, backend: str,
                  collective_deadline_s: float = COLLECTIVE_DEADLINE_S) -> Trainer:
    """A trainer of the job whose master is at ``master``, with the real parts: the job's spec from the
    master (waited for as long as a trainer ever waits), the model definition and its framework, the
    links over HTTP, the data set and the job's store."""
    spec = HttpMaster(master, token, give_up_s=MASTER_LOST_S).spec()
    md = read_model_def(spec.model_def)
    framework = load(framework_of(md))
    links = Links.http(master, token, master_lost_after_s(spec.launcher_timeout_s))
    spool = os.environ.get(AUDIT_SPOOL_ENV)
    return Trainer(trainer_id, host, spec, md, framework, links, Dataset(spec.data),
                   open_store(spec.checkpoint_uri, "--checkpoint-uri"), master_addr=master, backend=backend,
                   collective_deadline_s=collective_deadline_s,
                   audit_spool=audit_spool(Path(spool)) if spool else None)


def run_trainer(trainer_id: str, master: str, token: str, backend: str) -> int:
    host = os.environ.get("EDL_TRAINER_HOST") or socket.gethostbyname(socket.gethostname())
    if master.startswith(("127.", "localhost", "http://127.", "http://localhost")):
        host = "127.0.0.1"
    deadline_s = float(os.environ.get("EDL_COLLECTIVE_DEADLINE_S", str(COLLECTIVE_DEADLINE_S)))
    try:
        try:
            trainer = build_trainer(trainer_id, master, token, host, backend, deadline_s)
        except UserError as e:
            # Tell the master so the job fails with the reason, not just an exit code.
            try:
                HttpMaster(master, token, give_up_s=0.0).fail_job(str(e), user=True)
            except TemporaryError:
                pass  # the master is away: the launcher still sees the exit code
            raise
        signal.signal(signal.SIGTERM, trainer.leaving)  # told to stop: leave as a drained trainer does
        return trainer.run()
    except UserCodeError as e:
        raise _user_code_failed(trainer_id, master, token, e) from None
    except MasterUnavailable as e:
        # Gone longer than a restart takes: the job ended without us (its launcher and master died).
        log.error("trainer %s: %s for too long; ending itself", trainer_id, e)
        return EXIT_OK
