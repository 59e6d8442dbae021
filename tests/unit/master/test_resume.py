"""A restarted master goes on from its trainers' last step: the queue it rebuilds from the checkpoint
plus their reports is exactly the one the dead master had (no row lost, none trained twice)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from edl.api.data import Cursor, Shard, Task
from edl.api.master import Phase, Reason, ResumeReport, Source
from edl.api.spec import JobSpec
from edl.master.job import Job, RESTART_CAUSE
from edl.master.resume import RESUME_WINDOW_S, CutRecord, Restored, consumed_rows, plan_resume
from edl.master.tasks import TaskQueue
from edl.trainer.data import TaskBuffer

SHARDS = [Shard("a.parquet", 100), Shard("b.parquet", 37)]
UID, GEN = "111", 1


@dataclass
class Sim:
    """The dead master's queue and its trainers' buffers, stepped the way the real loop steps them."""

    members: tuple[str, ...]
    batch: int
    epochs: int = 2
    queue: TaskQueue = field(init=False)
    buffers: dict[str, TaskBuffer] = field(init=False)
    step: int = 0

    def __post_init__(self) -> None:
        self.queue = TaskQueue(SHARDS, self.epochs, rows_per_task=16)
        self.buffers = {m: TaskBuffer() for m in self.members}
        for b in self.buffers.values():
            b.clear((UID, GEN))

    def cursors(self) -> dict[str, Cursor | None]:
        return {m: b.cursor for m, b in self.buffers.items()}

    def run(self, steps: int) -> None:
        for _ in range(steps):
            before = self.cursors()
            for m, b in self.buffers.items():
                while b.remaining() < 2 * self.batch:
                    t = self.queue.next_task(m)
                    if not isinstance(t, Task):
                        break
                    b.add(t)
                b.take(self.batch)
            for m in self.members:  # committed one step late, as the heartbeats do
                self.queue.commit(m, before[m])
            self.step += 1

    def checkpoint(self, forget: bool) -> Restored:
        cursors = self.cursors()
        state = self.queue.cut(cursors)
        if forget:  # the commit reached the trainers: their ledgers start at the cut
            for m, b in self.buffers.items():
                b.forget_before((UID, GEN), cursors[m])
        return Restored(self.step, f"file:///ck/ckpt-{self.step}", CutRecord(UID, GEN, self.step, cursors), state)

    def reports(self, source: Source = Source.INIT, checkpoint_uri: str | None = None,
                base_step: int = 0) -> dict[str, ResumeReport]:
        cursors = self.cursors()
        out = {}
        for m, b in self.buffers.items():
            lg = b.ledger()
            out[m] = ResumeReport(UID, GEN, base_step, source, checkpoint_uri, self.step, self.members, cursors,
                                  lg.tasks, lg.start, lg.offset)
        return out


def unconsumed(q: TaskQueue) -> set[tuple[int, str, int]]:
    """Every (epoch, shard, row) not yet consumed, materialized or not."""
    rows = {(t.epoch, t.shard, r) for t in q.todo for r in range(t.start, t.end)}
    for e in range(q.materialized_epochs, q.epochs):
        rows |= {(e, s.name, r) for s in q.shards for r in range(s.rows)}
    for h in q.held.values():
        for i, t in enumerate(h.tasks):
            rows |= {(t.epoch, t.shard, r) for r in range(t.start + (h.offset if i == 0 else 0), t.end)}
    return rows


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3), batch=st.integers(1, 40), before=st.integers(0, 8), after=st.integers(0, 8),
       checkpointed=st.booleans(), forget=st.booleans())
def test_rebuilt_queue_is_the_dead_masters(n, batch, before, after, checkpointed, forget):
    sim = Sim(tuple(f"t{i}" for i in range(n)), batch)
    sim.run(before)
    if checkpointed:
        restored = sim.checkpoint(forget)
    else:  # no checkpoint yet: the master restarts from a fresh queue, the trainers' generation from scratch
        sim.run(0)
        fresh = TaskQueue(SHARDS, sim.epochs, rows_per_task=16)
        restored = Restored(0, None, None, fresh.to_state())
        sim.run(after)
        after = 0
    sim.run(after)
    plan = plan_resume(restored, sim.reports(), sim.members, waited_s=0.0)
    assert plan.rebuild and not plan.wait, plan.why
    assert plan.step == sim.step and plan.lead == sim.members[0] and plan.reported_step == sim.step
    rebuilt = TaskQueue.from_state(plan.queue_state)
    truth = TaskQueue.from_state(sim.queue.cut(sim.cursors()))
    assert rebuilt.done_rows == truth.done_rows
    assert unconsumed(rebuilt) == unconsumed(truth)


def test_a_generation_that_started_from_the_checkpoint_walks_from_its_ledgers_start():
    sim = Sim(("a", "b"), batch=10)
    state = sim.queue.to_state()
    restored = Restored(5, "file:///ck/ckpt-5", None, state)
    sim.run(4)
    plan = plan_resume(restored, sim.reports(Source.CHECKPOINT, "file:///ck/ckpt-5", base_step=5), ("a", "b"), 0.0)
    assert plan.rebuild and plan.step == 4
    # Another checkpoint than the one the generation started from: it cannot tell what was consumed.
    other = plan_resume(replace(restored, uri="file:///ck/ckpt-3"),
                        sim.reports(Source.CHECKPOINT, "file:///ck/ckpt-5", base_step=5), ("a", "b"), 0.0)
    assert not other.rebuild and "did not start from" in other.why


def test_waits_for_every_member_then_falls_back_to_the_checkpoint():
    sim = Sim(("a", "b"), batch=10)
    sim.run(3)
    restored = sim.checkpoint(forget=False)
    sim.run(5)
    only_a = {"a": sim.reports()["a"]}
    assert plan_resume(restored, only_a, ["a"], waited_s=0.5).wait
    late = plan_resume(restored, only_a, ["a"], waited_s=RESUME_WINDOW_S)
    assert not late.wait and not late.rebuild
    assert late.step == 3 and late.reported_step == 8 and "trainer b" in late.why


def test_reports_that_disagree_fall_back():
    sim = Sim(("a", "b"), batch=10)
    sim.run(3)
    restored = sim.checkpoint(forget=False)
    sim.run(2)
    reports = sim.reports()
    reports["b"] = replace(reports["b"], step=reports["b"].step + 1)
    plan = plan_resume(restored, reports, ["a", "b"], 0.0)
    assert not plan.rebuild and "different steps" in plan.why


def test_a_ledger_trimmed_past_the_restored_checkpoint_falls_back():
    sim = Sim(("a",), batch=16)  # one task per step: each checkpoint's cursor is in a task of its own
    sim.run(2)
    older = sim.checkpoint(forget=False)
    sim.run(3)
    sim.checkpoint(forget=True)  # committed, and the ledger trimmed, but this master read the older one
    sim.run(1)
    plan = plan_resume(older, sim.reports(), ["a"], 0.0)
    assert not plan.rebuild and "do not reach back" in plan.why


def test_consumed_rows_follow_the_ledger_across_tasks():
    t1, t2, t3 = Task(1, 0, "a", 0, 16), Task(2, 0, "a", 16, 32), Task(3, 1, "b", 0, 8)
    r = ResumeReport(UID, GEN, 0, Source.INIT, None, 9, ("x",), {}, (t1, t2, t3), Cursor(1, 4), 4)
    assert consumed_rows(r, Cursor(1, 4), Cursor(3, 5)) == [(0, "a", 4, 16), (0, "a", 16, 32), (1, "b", 0, 5)]
    assert consumed_rows(r, Cursor(2, 3), Cursor(2, 3)) == []
    assert consumed_rows(r, Cursor(3, 1), Cursor(2, 3)) is None  # backwards
    assert consumed_rows(r, Cursor(9, 0), Cursor(2, 3)) is None  # a task the ledger never had
    assert ResumeReport.from_json(r.to_json()) == r  # what a re-registration carries


def _spec() -> JobSpec:
    return JobSpec(job="j", model_def="edl.zoo.digits", data="d", epochs=2, batch_size=10, min_trainers=1,
                   max_trainers=4, trainers=2, checkpoint_uri="file:///ck", rows_per_task=16)


def _restarted_job(sim: Sim, restored: Restored) -> Job:
    state = {"step": restored.step, "queue": restored.queue_state, "desired": 2,
             "cut": restored.cut.to_json() if restored.cut else None}
    return Job(_spec(), SHARDS, master_uid="222", now=100.0, restored=state, restored_uri=restored.uri)


def test_a_restarted_job_goes_on_from_the_trainers_step():
    sim = Sim(("a", "b"), batch=10)
    sim.run(3)
    restored = sim.checkpoint(forget=True)
    sim.run(6)
    job = _restarted_job(sim, restored)
    reports = sim.reports()
    job.register("b", 2, "127.0.0.1", 2000, 100.0, reports["b"])
    assert job.membership.phase is Phase.FORMING  # a is not back yet
    job.register("a", 1, "127.0.0.1", 1000, 100.4, reports["a"])
    gen = job.membership.current
    assert gen is not None and gen.source is Source.PEER and gen.reason is Reason.RESUME
    assert gen.base_step == 9 and gen.members[0] == "a" and gen.rolled_back_steps == 0
    assert gen.triggered_at == 100.0  # the pause runs from the first re-registration
    assert gen.cause == RESTART_CAUSE
    assert job.checkpoint_requested  # so that the next restart finds a checkpoint of this master
    assert unconsumed(job.queue) == unconsumed(TaskQueue.from_state(sim.queue.cut(sim.cursors())))
    a = job.assignment("a")
    assert a is not None and a.source is Source.PEER and a.checkpoint_uri is None and a.held == ()
    assert a.state_to == ()  # both stopped at step 9 of one generation: no state travels


def test_a_restarted_job_missing_a_member_rolls_back_and_says_how_far():
    sim = Sim(("a", "b"), batch=10)
    sim.run(3)
    restored = sim.checkpoint(forget=False)
    sim.run(6)
    job = _restarted_job(sim, restored)
    job.register("a", 1, "127.0.0.1", 1000, 100.0, sim.reports()["a"])
    job.register("c", 3, "127.0.0.1", 3000, 100.5)  # a replacement for b, which died
    assert job.membership.current is None  # within the window: b may still come
    job.tick(100.0 + RESUME_WINDOW_S + 0.1)
    gen = job.membership.current
    assert gen is not None and gen.source is Source.CHECKPOINT and gen.base_step == 3
    assert gen.rolled_back_steps == 6 and gen.cause == RESTART_CAUSE
    assert gen.state_to == (1,)  # rank 0 loads the checkpoint and sends it
    assert job.resume_note is not None and "trainer b" in job.resume_note


def test_heartbeats_tell_each_member_its_cursor_in_the_committed_checkpoint():
    from edl.api.master import CheckpointRecord, HeartbeatAnswer, to_json

    job = Job(_spec(), SHARDS, master_uid="333", now=0.0)
    job.register("a", 1, "127.0.0.1", 1000, 0.0)
    job.register("b", 2, "127.0.0.1", 2000, 0.0)
    gen = job.membership.current
    assert gen is not None and job.heartbeat_answer("a").committed_cursor is None
    ta = job.next_task("a", "r1", None, 0.0)
    assert isinstance(ta, Task)
    state = job.checkpoint_cut(gen.id, 4, {"a": Cursor(ta.id, 5), "b": None}, 1.0)
    assert state["cut"]["master_uid"] == "333" and state["cut"]["step"] == 4
    assert job.heartbeat_answer("a").committed_cursor is None  # cut, not yet committed
    assert job.checkpoint_committed(CheckpointRecord(4, "file:///ck/ckpt-4", 0.1, gen.id))
    answer = job.heartbeat_answer("a")
    assert answer.committed_cursor == Cursor(ta.id, 5)
    assert HeartbeatAnswer.from_json(to_json(answer)) == answer
    assert job.heartbeat_answer("b").committed_cursor is None


def test_the_ledger_forgets_only_what_precedes_a_committed_cursor_of_its_own_generation():
    t1, t2, t3 = Task(1, 0, "a", 0, 16), Task(2, 0, "a", 16, 32), Task(3, 0, "b", 0, 8)
    b = TaskBuffer()
    b.reposition(Cursor(1, 4), [t1], 4, ("u", 2))
    b.add(t2)
    b.add(t3)
    b.add(t2)  # held already: not taken twice
    assert b.ledger().tasks == (t1, t2, t3) and b.ledger().offset == 4
    b.forget_before(("u", 1), Cursor(2, 3))  # another generation's checkpoint: nothing
    b.forget_before(("v", 2), Cursor(2, 3))  # another master's: nothing
    assert b.ledger().tasks == (t1, t2, t3)
    b.forget_before(("u", 2), Cursor(2, 3))
    lg = b.ledger()
    assert lg.tasks == (t2, t3) and lg.start == Cursor(2, 3) and lg.offset == 3
    b.clear(("u", 3))
    assert b.ledger() == type(lg)(("u", 3), (), None, 0)
