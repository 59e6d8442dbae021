"""The trainer's heartbeat (with its collective watchdog) and prefetch, against a fake master link."""

from __future__ import annotations

import threading

import pytest

from edl.api.data import Cursor, Task
from edl.api.master import HeartbeatAnswer, JobStatus, Next, TrainerState
from edl.errors import TemporaryError
from edl.trainer.data import TaskBuffer
from edl.trainer.heartbeat import Control, Heartbeat, stuck_in_collective
from edl.trainer.prefetch import Prefetcher
from edl.trainer.progress import Progress


def answer(uid="1", generation=2, stop=False, status=JobStatus.RUNNING, checkpoint=False, known=True, abort=False,
           state=TrainerState.ACTIVE, abort_through=None):
    return HeartbeatAnswer(uid, known, state, generation, stop, status, checkpoint, abort=abort,
                           abort_through=generation if abort_through is None else abort_through)


class FakeLink:
    def __init__(self, *answers) -> None:
        self.answers = list(answers)  # an answer, an exception to raise, or what a callable returns
        self.calls: list[tuple] = []
        self.asked_in: list[tuple] = []  # each task request's (master uid, generation)

    def _next(self):
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a() if callable(a) else a

    def heartbeat(self, trainer, *, generation, step, safe_cursor, loss, wait_s, in_collective_s=None, store_port=None,
                  heard=(0, False)):
        self.calls.append((trainer, generation, step, safe_cursor, loss, wait_s, in_collective_s))
        return self._next()

    def next_task(self, trainer, request_id, safe_cursor, *, master_uid=None, generation=None):
        self.calls.append((trainer, request_id, safe_cursor))
        self.asked_in.append((master_uid, generation))
        return self._next()


# ------------------------------------------------------------------ what the heartbeat learns
def test_a_stop_applies_to_its_generation_only():
    c = Control("1")
    c.learn(answer(generation=2, stop=True))
    assert c.stops(2) and not c.stops(3)


def test_a_restarted_master_or_an_ended_job_stops_any_generation():
    c = Control("1")
    c.learn(answer(uid="2"))  # another master that knows us: a stale one beside ours, not a restart
    assert not c.stops(5)
    c.learn(answer(uid="2", known=False))  # ours restarted and lost us
    assert c.stops(5)
    c.reset("2")
    assert not c.stops(5)
    c.learn(answer(uid="2", status=JobStatus.FAILED))
    assert c.stops(5)
    assert not Control(None).stops(1)  # not registered yet: any master is the first


def test_an_abort_leaves_its_generation_and_every_older_one():
    c = Control("1")
    assert not c.aborts(2)
    c.learn(answer(generation=3, abort=True))
    assert c.aborts(2) and c.aborts(3) and not c.aborts(4)
    c.learn(answer(generation=2))  # a late answer of an older generation takes nothing back
    assert c.aborts(3) and not c.dropped
    c.learn(answer(uid="2", generation=9, abort=True))  # a stale master's word is not ours
    assert not c.aborts(9)
    c.learn(answer(generation=3, abort=True, abort_through=6))  # a prepared generation it dropped
    assert c.aborts(6) and not c.aborts(7)


def test_a_trainer_the_master_dropped_leaves_whatever_generation_it_is_in():
    c = Control("1")
    c.learn(answer(generation=7, abort=True, state=TrainerState.FAILED))  # woken after the others moved on
    assert c.aborts(4) and c.dropped


def test_a_checkpoint_request_stays_until_taken_or_withdrawn():
    c = Control("1")
    c.learn(answer(checkpoint=True))
    assert c.checkpoint_requested and c.checkpoint_requested
    c.take_checkpoint_request()
    assert not c.checkpoint_requested
    c.learn(answer(checkpoint=True))
    c.learn(answer(checkpoint=False))
    assert not c.checkpoint_requested


@pytest.mark.parametrize("stuck, moved, gives_up", [
    (0.0, True, False), (15.0, True, False), (15.1, True, True), (15.1, False, False),
    (299.0, False, False), (300.1, False, True),
])
def test_the_watchdog_gives_up_past_the_deadline_or_once_the_master_moved_on(stuck, moved, gives_up):
    assert stuck_in_collective(stuck, 4, 5 if moved else 4, hang_s=15.0, deadline_s=300.0) is gives_up


# ------------------------------------------------------------------ the heartbeat
class Clock:
    def __init__(self, t=100.0) -> None:
        self.t = t
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)


def heartbeat(link, progress, control, clock, stuck):
    return Heartbeat(link, "t1", progress, control, on_stuck=lambda: stuck.append(True), clock=clock,
                     sleep=clock.sleep)


def test_a_heartbeat_reports_where_the_loop_is_and_passes_on_what_it_learned():
    clock, stuck = Clock(), []
    p = Progress(generation=2, step=7, safe_cursor=Cursor(3, 4), loss=0.25)
    c = Control("1")
    link = FakeLink(answer(stop=True))
    heartbeat(link, p, c, clock, stuck).beat()
    assert link.calls == [("t1", 2, 7, Cursor(3, 4), 0.25, 1.0, None)]
    assert c.stops(2) and not stuck and clock.slept == []


def test_an_unreachable_master_is_asked_again_shortly():
    clock, stuck = Clock(), []
    c = Control("1")
    heartbeat(FakeLink(TemporaryError("away")), Progress(generation=2), c, clock, stuck).beat()
    assert clock.slept == [0.2] and not c.stops(2) and not stuck


def test_a_master_that_forgot_us_is_not_asked_again_at_once():
    clock, stuck = Clock(), []
    heartbeat(FakeLink(answer(known=False)), Progress(generation=2), Control("1"), clock, stuck).beat()
    assert clock.slept == [0.1]


def test_stuck_in_a_collective_the_master_moved_on_from_exits():
    clock, stuck = Clock(), []
    c = Control("1")
    p = Progress(generation=2, in_collective_since=clock.t - 16)
    heartbeat(FakeLink(answer(generation=3, stop=True)), p, c, clock, stuck).beat()
    assert stuck == [True] and not c.stops(3)
    p.in_collective_since = clock.t - 16  # in the current generation: still waiting on peers
    heartbeat(FakeLink(answer(generation=2)), p, c, clock, stuck).beat()
    assert stuck == [True]
    p.in_collective_since = None  # between steps: never stuck
    clock.t += 1000
    heartbeat(FakeLink(answer(generation=9)), p, c, clock, stuck).beat()
    assert stuck == [True]


def test_stuck_in_a_collective_when_the_master_restarted_leaves_the_collective_not_the_process():
    """A lost node took the master and a peer: the survivor waits on the peer in its collective, and
    the new master, which never knew it, answers. It leaves the collective and joins the new master."""
    clock, stuck = Clock(), []
    c = Control("1")
    p = Progress(generation=2, in_collective_since=clock.t - 14)
    restarted = answer(uid="2", known=False, generation=0)
    heartbeat(FakeLink(restarted), p, c, clock, stuck).beat()
    assert not c.aborts(2) and c.master_changed  # not stuck long yet: the step may still end
    p.in_collective_since = clock.t - 16
    heartbeat(FakeLink(restarted), p, c, clock, stuck).beat()
    assert c.aborts(2) and c.master_changed and not stuck
    c2 = Control("1")  # a stale master beside ours (it knows us): nothing it says is ours
    heartbeat(FakeLink(answer(uid="2", known=True)), p, c2, clock, stuck).beat()
    assert not c2.aborts(2) and not c2.master_changed and not stuck


def test_a_woken_trainer_told_it_was_dropped_leaves_through_the_loop_not_the_watchdog():
    clock, stuck = Clock(), []
    c = Control("1")
    p = Progress(generation=2, in_collective_since=clock.t - 600)  # stopped (SIGSTOP) for ten minutes
    link = FakeLink(answer(generation=4, abort=True, state=TrainerState.FAILED))
    heartbeat(link, p, c, clock, stuck).beat()
    assert link.calls[0][-1] == 600.0  # it says how long it has been in the collective
    assert not stuck and c.aborts(2) and c.dropped


# ------------------------------------------------------------------ the prefetch
def task(i: int, rows: int = 16) -> Task:
    return Task(i, 0, "a.parquet", i * rows, (i + 1) * rows)


def prefetcher(link, progress, buffer=None, warm=lambda task: None, full_wait_s=0.0):
    clock = Clock()
    ids = iter(f"r{i}" for i in range(100))
    return Prefetcher(link, "t1", buffer or TaskBuffer(), 16, progress, sleep=clock.sleep,
                      new_id=lambda: next(ids), warm=warm, full_wait_s=full_wait_s), clock


def test_nothing_is_fetched_before_the_first_generation():
    link = FakeLink()
    pf, clock = prefetcher(link, Progress(generation=0))
    pf.fetch()
    assert link.calls == [] and clock.slept == [0.01]


def test_tasks_are_fetched_until_two_batches_are_held():
    link = FakeLink(task(0), task(1), task(2))
    p = Progress(generation=1, safe_cursor=Cursor(0, 3))
    pf, clock = prefetcher(link, p)
    pf.fetch()
    pf.fetch()
    pf.fetch()  # 32 rows held: enough
    assert [c[1] for c in link.calls] == ["r0", "r1"] and link.calls[0][2] == Cursor(0, 3)
    assert pf.buffer.remaining() == 32 and clock.slept == []  # it waited on the buffer, not the clock


class Waits(threading.Condition):
    """The buffer's condition, telling how each wait on it ended (``True``: notified, ``False``: timed out)
    and when one begins."""

    def __init__(self, lock) -> None:
        super().__init__(lock)
        self.ended: list[bool] = []
        self.waiting = threading.Event()

    def wait(self, timeout=None) -> bool:
        self.waiting.set()
        notified = super().wait(timeout)
        self.ended.append(notified)
        return notified


def test_a_full_buffer_is_waited_on_until_the_loop_takes_a_batch_not_polled():
    # A blocking wait on the buffer's condition, not a sleep: no clock to fake. What ends the wait is
    # told by the condition itself: the loop's take (a notification), not the full wait's 30 s running out.
    link = FakeLink(task(0), task(1), task(2))
    pf, clock = prefetcher(link, Progress(generation=1), full_wait_s=30.0)
    waits = pf.buffer._took = Waits(pf.buffer._lock)
    pf.fetch()
    pf.fetch()
    taken: list = []

    def take() -> None:  # the loop's next batch, while the prefetcher waits
        waits.waiting.wait(10.0)
        taken.append(pf.buffer.take(16))

    taker = threading.Thread(target=take)
    taker.start()
    pf.fetch()  # full: returns when the batch is taken, not after a poll's or the full wait's time
    taker.join(10.0)
    assert taken and waits.ended == [True] and clock.slept == [] and len(link.calls) == 2
    pf.fetch()
    assert len(link.calls) == 3 and pf.buffer.remaining() == 32


def test_a_lost_answer_is_asked_for_again_with_the_same_request_id():
    link = FakeLink(TemporaryError("away"), task(0))
    pf, clock = prefetcher(link, Progress(generation=1))
    pf.fetch()
    pf.fetch()
    assert [c[1] for c in link.calls] == ["r0", "r0"] and clock.slept == [0.2]
    assert pf.buffer.remaining() == 16


def test_a_wait_pauses_and_finished_ends_the_fetching():
    link = FakeLink(Next.WAIT, task(0), Next.FINISHED)
    pf, clock = prefetcher(link, Progress(generation=1))
    for _ in range(4):
        pf.fetch()
    assert [c[1] for c in link.calls] == ["r0", "r1", "r2"] and clock.slept == [0.05, 0.01]
    assert pf.finished and not pf.out_of_data()
    pf.buffer.take(16)
    assert pf.out_of_data()
    pf.restart()
    assert not pf.finished and pf.buffer.remaining() == 0


def test_each_new_task_is_read_ahead_once():
    warmed: list[Task] = []
    link = FakeLink(task(0), Next.WAIT, TemporaryError("away"), task(0), task(1))  # task 0 handed out again
    pf, _ = prefetcher(link, Progress(generation=1), warm=warmed.append)
    for _ in range(5):
        pf.fetch()
    assert warmed == [task(0), task(1)] and pf.buffer.remaining() == 32


def in_generation(key: tuple[str, int]) -> TaskBuffer:
    buffer = TaskBuffer()
    buffer.clear(key)
    return buffer


def test_a_request_names_the_generation_its_tasks_are_for():
    link = FakeLink(task(0))
    pf, _ = prefetcher(link, Progress(generation=3), in_generation(("7", 3)))
    pf.fetch()
    assert link.asked_in == [("7", 3)] and pf.buffer.remaining() == 16


def test_a_task_answered_after_the_loop_joined_another_generation_is_not_held():
    # The loop joined generation 4 (its assignment lists what it holds) while the request made in 3 was on
    # the wire: the master counts that task in the assignment's list or took it back; holding it too
    # would train its rows twice.
    warmed: list[Task] = []
    buffer = in_generation(("7", 3))

    def joined_on_the_wire() -> Task:
        buffer.reposition(None, [task(5)], 0, ("7", 4))
        return task(0)

    link = FakeLink(joined_on_the_wire, task(1))
    pf, _ = prefetcher(link, Progress(generation=3), buffer, warm=warmed.append)
    pf.fetch()
    assert [t.id for t in buffer.tasks] == [5] and buffer.ledger().tasks == (task(5),) and warmed == []
    pf.fetch()
    assert link.asked_in == [("7", 3), ("7", 4)] and [t.id for t in buffer.tasks] == [5, 1]


def test_a_task_answered_after_a_switch_that_keeps_the_tasks_is_held():
    buffer = in_generation(("7", 3))

    def switched_on_the_wire() -> Task:
        buffer.rekey(("7", 4))  # the generation goes on with what is held
        return task(0)

    pf, _ = prefetcher(FakeLink(switched_on_the_wire), Progress(generation=3), buffer)
    pf.fetch()
    assert [t.id for t in buffer.tasks] == [0] and buffer.ledger().tasks == (task(0),)


@pytest.mark.parametrize("change, ids", [("clear", ["r0", "r1"]), ("rekey", ["r0", "r0"])])
def test_a_request_lost_before_a_change_is_asked_again_only_where_the_buffer_goes_on(change, ids):
    # After a switch that keeps the tasks the master holds the lost answer's task for us, and only the same
    # id gets it (``TaskQueue.replay``). After the buffer was replaced, the same id would get the task of
    # before the change, which the change's assignment already accounted for.
    buffer = in_generation(("7", 3))
    link = FakeLink(TemporaryError("away"), task(0))
    pf, _ = prefetcher(link, Progress(generation=3), buffer)
    pf.fetch()
    getattr(buffer, change)(("7", 4))
    pf.fetch()
    assert [c[1] for c in link.calls] == ids and link.asked_in == [("7", 3), ("7", 4)]
    assert [t.id for t in buffer.tasks] == [0]


def test_finished_said_before_a_start_from_a_checkpoint_is_not_taken_after_it():
    # The master had handed out everything; the generation that starts from a checkpoint has tasks again.
    buffer = in_generation(("7", 3))
    pf = None

    def restarted_on_the_wire():
        pf.restart(("7", 4))
        return Next.FINISHED

    link = FakeLink(restarted_on_the_wire, task(0), Next.FINISHED)
    pf, _ = prefetcher(link, Progress(generation=3), buffer)
    pf.fetch()
    assert not pf.finished
    pf.fetch()
    pf.fetch()
    assert pf.finished and [t.id for t in buffer.tasks] == [0]


def test_a_prepared_generation_has_the_go_once_given_or_once_formed():
    from edl.api.master import Prepared

    c = Control("1")
    p = Prepared(5, ("a", "b"), ("h", 1), (1,), False)
    c.learn(HeartbeatAnswer("1", True, TrainerState.WAITING, 4, False, JobStatus.RUNNING, False, prepared=p))
    assert not c.go(5) and c.heard() == (5, False) and not c.prepared_dropped(5)
    c.learn(HeartbeatAnswer("1", True, TrainerState.WAITING, 4, False, JobStatus.RUNNING, False,
                            prepared=Prepared(5, ("a", "b"), ("h", 1), (1,), True)))
    assert c.go(5) and c.heard() == (5, True)
    # The others switched and the master formed it before our next heartbeat: still the go, not dropped.
    c.learn(HeartbeatAnswer("1", True, TrainerState.WAITING, 5, False, JobStatus.RUNNING, False))
    assert c.go(5) and not c.prepared_dropped(5) and c.heard() == (0, False)
    c.learn(HeartbeatAnswer("1", True, TrainerState.WAITING, 6, False, JobStatus.RUNNING, False))
    assert not c.go(5) and c.prepared_dropped(5)


def test_a_joiner_knows_its_prepared_generation_superseded_without_having_heard_of_it():
    # The joiner's assignment to prepared generation 2 came before any heartbeat named it, and the master
    # dropped it (a third trainer registered) before the next: that heartbeat already names generation 3.
    # Waiting to have "heard" of 2 first kept such a joiner in 2's rendezvous until its deadline (30 s).
    from edl.api.master import Prepared

    c = Control("1")
    assert not c.superseded(2)
    c.learn(HeartbeatAnswer("1", True, TrainerState.WAITING, 1, False, JobStatus.RUNNING, False,
                            prepared=Prepared(3, ("a", "b", "c"), ("h", 1), (1, 2), False)))
    assert c.superseded(2)
    # A later generation formed by a stop (the preparation timed out) supersedes it too.
    c.learn(HeartbeatAnswer("1", True, TrainerState.WAITING, 4, False, JobStatus.RUNNING, False))
    assert c.superseded(2) and c.superseded(3)
    # Formed (the others switched into it), with the next change prepared already: not superseded.
    c.learn(HeartbeatAnswer("1", True, TrainerState.ACTIVE, 4, False, JobStatus.RUNNING, False,
                            prepared=Prepared(5, ("a", "b"), ("h", 1), (), False)))
    assert not c.superseded(4)


def test_the_ask_for_a_task_waits_a_random_share_of_half_the_time_the_held_rows_last():
    from edl.trainer.prefetch import ASK_SHARE, MAX_ASK_DELAY_S, AskPace

    pace = AskPace(alpha=1.0)
    assert pace.delay_s(32, 0.99) == 0.0  # no pace yet: at once
    pace.observe(10.0, 0)
    pace.observe(10.2, 0)  # the loop took nothing: no figure
    pace.observe(10.5, 64)  # 64 rows in 0.5 s
    assert pace.rows_per_s == 128.0
    assert pace.delay_s(32, 0.5) == 0.5 * ASK_SHARE * 32 / 128.0  # 32 rows last 0.25 s: at most a share of it
    assert AskPace(share=0.0).delay_s(32, 0.99) == 0.0
    assert pace.delay_s(32, 0.0) == 0.0 and pace.delay_s(0, 0.9) == 0.0
    assert AskPace(alpha=1.0).delay_s(10 ** 9, 0.9) == 0.0
    slow = AskPace(alpha=1.0)
    slow.observe(0.0, 0)
    slow.observe(100.0, 1)
    assert slow.delay_s(1000, 0.99) == MAX_ASK_DELAY_S
    pace.restart()  # a new generation: the wait for its first rows is not the pace
    pace.observe(20.0, 64)
    pace.observe(30.0, 65)  # measured from 20.0, not from 10.5
    assert pace.rows_per_s == 0.1


class RecordedWaits(TaskBuffer):
    def __init__(self) -> None:
        super().__init__()
        self.waits: list[tuple[int, float]] = []

    def wait_below(self, rows: int, timeout_s: float) -> bool:
        self.waits.append((rows, timeout_s))
        return self.remaining() < rows


def test_the_prefetch_spreads_its_asks_once_the_pace_is_known_and_asks_at_once_when_short():
    from edl.trainer.prefetch import ASK_SHARE

    link = FakeLink(task(0), task(1), task(2), task(3))
    t = [0.0]
    buffer = RecordedWaits()
    ids = iter(f"r{i}" for i in range(100))
    pf = Prefetcher(link, "t1", buffer, 16, Progress(generation=1), sleep=lambda s: None,
                    new_id=lambda: next(ids), clock=lambda: t[0], uniform=lambda: 0.5)
    pf.fetch()
    pf.fetch()  # two batches held, at once: no pace yet
    assert len(link.calls) == 2 and buffer.waits == []
    buffer.take(16)
    t[0] = 0.5  # 16 rows in 0.5 s: 32 rows/s
    pf.fetch()  # 16 rows held (half a second): waits u x the share of 0.5 s, or until under a batch
    assert buffer.waits == [(16, 0.5 * ASK_SHARE * 0.5)] and len(link.calls) == 3
    buffer.take(32)  # nothing held: the ask goes at once
    pf.fetch()
    assert len(buffer.waits) == 1 and len(link.calls) == 4
