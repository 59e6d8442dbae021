"""``Job.revision``: the master wakes its long polls only when it moves, so it must move whenever anything
a long poll waits on changes: a trainer's heartbeat news (stop, abort, the prepared generation and its go),
its assignment, and the launcher's ``control_key``; ``Job.beat_revision``, which alone wakes the waiting
heartbeats, whenever a heartbeat's news changes. Checked over random runs of the job's operations."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from edl.api.cluster import SizeCause, SizeReason
from edl.api.data import Cursor, Shard, Task
from edl.api.master import CheckpointRecord, HeartbeatAnswer, NoAssignment, SyncReport, Unassigned
from edl.api.spec import JobSpec
from edl.errors import EdlError
from edl.master.job import Job, Timeouts

TRAINERS = [f"t{i}" for i in range(5)]


def news(a: HeartbeatAnswer) -> tuple:
    """What the heartbeat's long poll compares (``server.heartbeat``)."""
    return a.stop, a.abort, None if a.prepared is None else (a.prepared.generation, a.prepared.go)


class JobRun(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        spec = JobSpec(job="rev", model_def="m", data="d", epochs=3, batch_size=4, min_trainers=1, max_trainers=4,
                       trainers=2, checkpoint_uri="/tmp/x", launcher_timeout_s=20.0)
        self.job = Job(spec, [Shard("a.parquet", 20)], master_uid="1", now=0.0,
                       timeouts=Timeouts(lease_s=6.0, sync_timeout_s=4.0, prepare=True))
        self.now = 0.0
        self.steps: dict[str, int] = {}
        self.tasks: dict[str, list[Task]] = {}
        self.cuts: list[tuple[int, int]] = []
        self.heartbeating: str | None = None
        self.requests = 0
        self.seen = self.observe()

    # --------------------------------------------------------------- what the polls see
    def generations(self) -> range:
        m = self.job.membership
        top = max([g.id for g in m.history] + [m.prepared.id if m.prepared else 0, m.next_generation])
        return range(top + 1)

    def observe(self) -> tuple:
        job = self.job
        polls = []
        for t in TRAINERS:
            if t == self.heartbeating:
                continue  # its own heartbeat's answer is read by that very request, not by a poll
            polls.append(news(job.heartbeat_answer(t)))
            for after in self.generations():
                a = job.assignment_answer(t, after)
                polls.append(not (isinstance(a, NoAssignment) and a.why is Unassigned.WAIT))
        return tuple(polls), job.control_key()

    def observe_beats(self) -> tuple:
        """What the waiting heartbeats compare, woken by ``Job.beat_revision`` alone."""
        return tuple(news(self.job.heartbeat_answer(t)) for t in TRAINERS if t != self.heartbeating)

    def act(self, fn) -> None:
        before, seen = self.job.revision(), self.observe()
        beats_before, beats_seen = self.job.beat_revision(), self.observe_beats()
        try:
            fn()
        except EdlError:
            pass
        if self.observe() != seen:
            assert self.job.revision() != before, "a long poll's answer changed, the revision did not"
        if self.observe_beats() != beats_seen:
            assert self.job.beat_revision() != beats_before, "a heartbeat's news changed, its revision did not"
        self.heartbeating = None
        self.seen = self.observe()

    def request_id(self) -> str:
        self.requests += 1
        return f"r{self.requests}"

    def cursor(self, t: str, rows: int) -> Cursor | None:
        """``rows`` into the trainer's held tasks (all of them when it holds fewer)."""
        for task in self.job.queue.held_by(t):
            if rows <= task.end - task.start:
                return Cursor(task.id, rows)
            rows -= task.end - task.start
        return None

    # --------------------------------------------------------------------- operations
    @rule(dt=st.floats(0.0, 3.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.act(lambda: self.job.tick(self.now))

    @rule()
    def launcher_beat(self) -> None:
        self.act(lambda: self.job.launcher_beat(self.now))

    @rule(t=st.sampled_from(TRAINERS))
    def register(self, t: str) -> None:
        self.act(lambda: self.job.register(t, 1, "h", 9000 + len(self.steps), self.now))

    @rule(t=st.sampled_from(TRAINERS), steps=st.integers(0, 3), rows=st.integers(0, 40),
          waiting=st.none() | st.floats(0.0, 5.0), port=st.integers(9100, 9104), prepared=st.booleans())
    def heartbeat(self, t: str, steps: int, rows: int, waiting: float | None, port: int, prepared: bool) -> None:
        m = self.job.membership
        self.steps[t] = self.steps.get(t, 0) + steps
        gen = m.prepared.id if prepared and m.prepared else (m.current.id if m.current else 0)
        self.heartbeating = t
        self.act(lambda: self.job.heartbeat(t, self.steps[t], self.cursor(t, rows), self.now, 0.5, gen, waiting,
                                            port))

    @rule(t=st.sampled_from(TRAINERS))
    def next_task(self, t: str) -> None:
        self.act(lambda: self.job.next_task(t, self.request_id(), None, self.now))

    @rule(i=st.integers(0, 4))
    def train(self, i: int) -> None:
        """A member takes a task and consumes it whole, and its heartbeat commits it: the data moves on."""
        members = self.job.membership.members()
        if not members:
            return
        t = members[i % len(members)]
        task = self.job.next_task(t, self.request_id(), None, self.now)
        if isinstance(task, Task):
            self.steps[t] = self.steps.get(t, 0) + 4
            m = self.job.membership
            self.heartbeating = t
            self.act(lambda: self.job.heartbeat(t, self.steps[t], Cursor(task.id, task.end - task.start), self.now,
                                                0.5, m.current.id if m.current else 0, None, 9100))

    @rule(t=st.sampled_from(TRAINERS))
    def drain(self, t: str) -> None:
        self.act(lambda: self.job.drain(t, self.now))

    @rule(t=st.sampled_from(TRAINERS))
    def leave(self, t: str) -> None:
        self.act(lambda: self.job.leave(t, self.now))

    @rule(t=st.sampled_from(TRAINERS), code=st.sampled_from([0, 1, -9]))
    def exited(self, t: str, code: int) -> None:
        self.act(lambda: self.job.trainer_exited(t, code, self.now))

    @rule(t=st.sampled_from(TRAINERS), failed=st.booleans(), switched=st.booleans())
    def sync(self, t: str, failed: bool, switched: bool) -> None:
        m = self.job.membership
        gen = m.current.id if m.current else 0
        to = m.prepared.id if switched and m.prepared else None
        report = SyncReport(t, gen, self.steps.get(t, 0), {t: self.cursor(t, 2)}, 9200, failed, to)
        self.act(lambda: self.job.sync(report, self.now))

    @rule(t=st.sampled_from(TRAINERS))
    def prepared_ready(self, t: str) -> None:
        p = self.job.membership.prepared
        self.act(lambda: self.job.prepared_ready(t, p.id if p else 0, self.now))

    @rule(prepared=st.booleans())
    def first_step(self, prepared: bool) -> None:
        m = self.job.membership
        gen = m.prepared.id if prepared and m.prepared else (m.current.id if m.current else 0)
        self.act(lambda: self.job.first_step(gen, self.now))

    @rule(n=st.integers(1, 4), cause=st.sampled_from(list(SizeCause)))
    def scale(self, n: int, cause: SizeCause) -> None:
        self.act(lambda: self.job.scale(n, (), SizeReason(cause, "x"), self.now))

    @rule(count=st.integers(0, 2))
    def unschedulable(self, count: int) -> None:
        self.act(lambda: self.job.report_unschedulable(count, self.now))

    @rule()
    def request_checkpoint(self) -> None:
        self.act(self.job.request_checkpoint)

    @precondition(lambda self: self.job.membership.current is not None)
    @rule()
    def cut(self) -> None:
        m = self.job.membership
        gen, step = m.current.id, max(self.steps.values(), default=0)
        self.cuts.append((gen, step))
        self.act(lambda: self.job.checkpoint_cut(gen, step, {t: None for t in m.current.members}, self.now))

    @precondition(lambda self: bool(self.cuts))
    @rule()
    def committed(self) -> None:
        gen, step = self.cuts.pop(0)
        self.act(lambda: self.job.checkpoint_committed(CheckpointRecord(step, f"/tmp/x/{step}", 0.1, gen)))

    @rule()
    def finish(self) -> None:
        self.act(lambda: self.job.finish(max(self.steps.values(), default=0), None, {}, self.now))

    @invariant()
    def polls_are_current(self) -> None:
        assert self.observe() == self.seen


JobRun.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])
test_the_revision_moves_whenever_a_long_polls_answer_does = JobRun.TestCase
