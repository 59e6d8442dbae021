"""A trainer told to stop (SIGTERM) asks the master to drain it, and exits at once only where it cannot."""

from __future__ import annotations

import signal

from edl.errors import TemporaryError
from edl.trainer.leaving import Leaving


class Link:
    def __init__(self, fails: bool = False, answers: int | None = None) -> None:
        self.fails = fails
        self.answers = answers  # how many calls the master answers before it goes away
        self.asked: list[str] = []

    def leave(self, trainer: str) -> None:
        self.asked.append(trainer)
        if self.fails or (self.answers is not None and len(self.asked) > self.answers):
            raise TemporaryError("master unreachable")


def leaving(link: Link, timeout_s: float = 15.0, poll_s: float = 0.5) -> tuple[Leaving, list[int]]:
    exits: list[int] = []
    run_now = lambda fn: fn()  # noqa: E731 (the thread's work, run in the test's thread)
    return (Leaving("t3", link, exits.append, timeout_s=timeout_s, poll_s=poll_s, start=run_now),  # type: ignore[arg-type]
            exits)


def test_a_registered_trainer_asks_to_be_drained_and_is_not_cut_short_once_its_loop_ends():
    link = Link()
    handler, exits = leaving(link, timeout_s=5.0)
    handler.registered = True
    handler.ended.set()  # it left at the switch before the timeout
    handler(signal.SIGTERM)
    assert link.asked == ["t3"] and exits == []


def test_it_exits_when_the_switch_does_not_come_in_time():
    link = Link()
    handler, exits = leaving(link, timeout_s=0.01)
    handler.registered = True
    handler(signal.SIGTERM)
    assert link.asked == ["t3"] and exits == [128 + signal.SIGTERM]


def test_it_exits_at_once_before_registering_when_the_master_is_away_or_on_a_second_signal():
    link = Link()
    handler, exits = leaving(link)
    handler(signal.SIGTERM)  # nothing to drain yet
    assert link.asked == [] and exits == [143]

    away, exits = leaving(Link(fails=True))
    away.registered = True
    away(signal.SIGTERM)
    assert exits == [143]

    link = Link()
    twice, exits = leaving(link, timeout_s=5.0)
    twice.registered = True
    twice.ended.set()
    twice(signal.SIGTERM)
    twice(signal.SIGTERM)
    assert link.asked == ["t3"] and exits == [143]


def test_it_exits_at_once_when_the_master_goes_away_while_it_waits():
    # The whole job is being torn down (a cancel, a deleted namespace): nothing to wait for.
    link = Link(answers=2)
    handler, exits = leaving(link, timeout_s=10.0, poll_s=0.01)
    handler.registered = True
    handler(signal.SIGTERM)
    assert link.asked == ["t3"] * 3 and exits == [143]
