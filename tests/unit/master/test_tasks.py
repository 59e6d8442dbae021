from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edl.errors import TaskFailedError
from edl.api.data import Cursor, Shard, Task
from edl.api.master import Next
from edl.master.tasks import TaskQueue


def accounted(q: TaskQueue) -> dict[int, int]:
    """done + todo + held-but-unconsumed rows, per epoch."""
    out = dict(q.done_rows)
    for t in q.todo:
        out[t.epoch] += t.size
    for h in q.held.values():
        for i, t in enumerate(h.tasks):
            out[t.epoch] += t.size - (h.offset if i == 0 else 0)
    return out


def outstanding_ranges(q: TaskQueue) -> list[tuple[int, str, int, int]]:
    rng = [(t.epoch, t.shard, t.start, t.end) for t in q.todo]
    for h in q.held.values():
        for i, t in enumerate(h.tasks):
            rng.append((t.epoch, t.shard, t.start + (h.offset if i == 0 else 0), t.end))
    return rng


def make_queue(epochs: int = 2) -> TaskQueue:
    return TaskQueue([Shard("a.parquet", 100), Shard("b.parquet", 37)], epochs, rows_per_task=16)


def test_hands_out_every_row_once_then_finishes():
    q = make_queue(epochs=1)
    seen = []
    while True:
        t = q.next_task("w")
        if t is Next.FINISHED:
            break
        assert isinstance(t, Task)
        seen.append(t)
        q.commit("w", Cursor(t.id, t.size))
    assert sum(t.size for t in seen) == 137
    assert q.finished and q.epochs_completed == 1


def test_retried_request_gets_the_same_task():
    q = make_queue()
    a = q.next_task("w", "req-1")
    b = q.next_task("w", "req-1")
    c = q.next_task("w", "req-2")
    assert a == b and c != a
    assert len(q.held_by("w")) == 2


def test_release_returns_exactly_the_unconsumed_rows():
    q = make_queue(epochs=1)
    t1 = q.next_task("w")
    t2 = q.next_task("w")
    q.release("w", Cursor(t1.id, 5), failed=False)
    front = list(q.todo)[:2]
    assert (front[0].shard, front[0].start, front[0].end) == (t1.shard, t1.start + 5, t1.end)
    assert front[1] == t2
    assert q.done_rows[0] == 5


def test_failures_past_the_limit_name_the_shard():
    q = TaskQueue([Shard("bad.parquet", 10)], 1, rows_per_task=10, max_task_failures=2)
    for _ in range(2):
        t = q.next_task("w")
        q.release("w", Cursor(t.id, 0), failed=True)
    t = q.next_task("w")
    with pytest.raises(TaskFailedError, match="bad.parquet"):
        q.release("w", Cursor(t.id, 0), failed=True)


def test_a_tasks_failures_are_forgiven_once_some_of_its_rows_are_done():
    # Its holders are preempted part way through, again and again: no bad data, the job goes on.
    q = TaskQueue([Shard("ok.parquet", 100)], 1, rows_per_task=100, max_task_failures=2)
    for _ in range(10):
        t = q.next_task("w")
        q.release("w", Cursor(t.id, 5), failed=True)
    assert q.todo[0].failures == 1 and q.todo[0].start == 50
    # Then it fails where it stands, with no row done: bad rows there; counted from that last failure.
    t = q.next_task("w")
    q.release("w", Cursor(t.id, 0), failed=True)
    t = q.next_task("w")
    with pytest.raises(TaskFailedError, match="failed 3 times with none of its rows done between"):
        q.release("w", Cursor(t.id, 0), failed=True)


def test_cut_is_non_destructive_and_restorable():
    q = make_queue(epochs=1)
    t = q.next_task("w")
    state = q.cut({"w": Cursor(t.id, 3)})
    assert q.held_by("w") == [t]  # unchanged
    r = TaskQueue.from_state(state)
    assert r.done_rows[0] == 3
    assert accounted(r)[0] == 137


ops = st.lists(
    st.tuples(st.sampled_from(["next", "commit", "release", "fail"]), st.sampled_from(["a", "b", "c"]),
              st.integers(0, 40), st.integers(0, 3)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_rows_are_never_lost_or_duplicated(steps):
    q = make_queue(epochs=2)
    q.max_task_failures = 1000
    for op, w, k, i in steps:
        held = q.held_by(w)
        if op == "next":
            q.next_task(w)
        elif op in ("commit", "release") and held:
            t = held[min(i, len(held) - 1)]
            cur = Cursor(t.id, min(k, t.size))
            if op == "commit":
                q.commit(w, cur)
            else:
                q.release(w, cur, failed=bool(i % 2))
        elif op == "fail" and held:
            q.fail_task(w, held[0].id, "boom")
        acc = accounted(q)
        for e in range(q.materialized_epochs):
            assert acc[e] == 137, (e, acc)
        ranges = sorted(outstanding_ranges(q))
        for (e1, s1, _, b1), (e2, s2, a2, _) in zip(ranges, ranges[1:]):
            assert not (e1 == e2 and s1 == s2 and a2 < b1), "overlapping outstanding rows"
