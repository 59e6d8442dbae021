"""The collective runner: a blocking call the master aborted is left to its thread, and the loop goes on."""

from __future__ import annotations

import threading

import pytest

from edl.errors import CollectiveError
from edl.errors import Abandoned
from edl.frameworks.paddle.group import PaddleGroup as Group
from edl.trainer.collective import Runner


def test_a_call_that_completes_answers_its_result_and_its_error():
    r = Runner()
    assert r.run(lambda: 41 + 1, lambda: False) == 42

    def fails() -> None:
        raise CollectiveError("all-reduce failed: Connection reset by peer")

    with pytest.raises(CollectiveError, match="reset by peer"):
        r.run(fails, lambda: False)
    assert r.run(lambda: "again", lambda: False) == "again" and r.abandoned == 0


def test_an_aborted_call_is_left_behind_and_the_next_one_runs_on_a_fresh_thread():
    r = Runner(poll_s=0.001)
    release = threading.Event()
    entered = threading.Event()
    aborted = threading.Event()
    group = Group("127.0.0.1", 0, 0, 1, 1)  # world 1: no process group, but it can be abandoned

    def blocked() -> str:  # a collective whose peer will never answer
        entered.set()
        release.wait(30)
        return "late"

    threading.Timer(0.05, aborted.set).start()
    with pytest.raises(Abandoned):
        r.run(blocked, aborted.is_set, group)
    assert entered.is_set() and r.abandoned == 1
    with pytest.raises(Abandoned):  # the group refuses every later call ...
        group.all_reduce_sum(None)  # type: ignore[arg-type]
    assert r.run(lambda: "next generation", lambda: False) == "next generation"  # ... the runner does not
    release.set()


def test_an_abort_known_before_the_call_starts_nothing():
    started: list[bool] = []
    with pytest.raises(Abandoned):
        Runner().run(lambda: started.append(True), lambda: True)
    assert started == []


def test_submitted_calls_run_in_order_and_an_abort_cancels_those_not_started():
    r = Runner(poll_s=0.001)
    order: list[int] = []
    release = threading.Event()
    first = r.submit(lambda: order.append(1))
    blocked = r.submit(lambda: release.wait(30))  # a bucket's all-reduce whose peer is gone
    later = r.submit(lambda: order.append(3))
    group = Group("127.0.0.1", 0, 0, 1, 1)
    aborted = threading.Event()
    threading.Timer(0.05, aborted.set).start()
    with pytest.raises(Abandoned):
        r.wait(later, aborted.is_set, group)
    assert first.done() and order == [1] and later.cancelled() and r.abandoned == 1
    assert r.run(lambda: "fresh thread", lambda: False) == "fresh thread"
    release.set()
    blocked.result(5)
    assert order == [1]  # the cancelled call never ran
