"""The prepared generation on the trainer's side: formed in the background, switched into only with the
master's go and a formed group, dropped (and its group closed) when the master drops or replaces it."""

from __future__ import annotations

import threading

from edl.api.master import Prepared
from edl.errors import CollectiveError
from edl.trainer.prepared import Preparation


class FakeGroup:
    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Former:
    """Forms groups when told to (``release``), as a rendezvous completes once every peer came."""

    def __init__(self) -> None:
        self.gates: dict[int, threading.Event] = {}
        self.formed: dict[int, FakeGroup] = {}
        self.fail: set[int] = set()

    def __call__(self, p: Prepared) -> FakeGroup:
        gate = self.gates.setdefault(p.generation, threading.Event())
        gate.wait(5)
        if p.generation in self.fail:
            raise CollectiveError("a peer never came")
        self.formed[p.generation] = FakeGroup(p.generation)
        return self.formed[p.generation]

    def release(self, generation: int) -> None:
        self.gates.setdefault(generation, threading.Event()).set()


def prepared(generation=5, members=("a", "b", "c"), go=False) -> Prepared:
    return Prepared(generation, members, ("h", 1), (2,), go)


def wait_until(cond) -> None:
    for _ in range(500):
        if cond():
            return
        threading.Event().wait(0.01)
    raise AssertionError("timed out")


def test_a_member_switches_only_with_the_go_and_its_group_formed():
    former = Former()
    prep = Preparation("a", former)
    prep.update(prepared())
    assert prep.switch_to() == 0  # forming
    former.release(5)
    wait_until(lambda: 5 in former.formed)
    assert prep.switch_to() == 0  # formed, but no go yet
    prep.update(prepared(go=True))
    wait_until(lambda: prep.switch_to() == 5)
    p, group = prep.take(5)
    assert p.generation == 5 and group is former.formed[5] and not group.closed
    prep.update(prepared(go=True))  # answers may still name it until the master formed it
    assert prep.switch_to() == 0 and len(former.gates) == 1  # not formed again


def test_a_member_that_leaves_has_nothing_to_form():
    former = Former()
    prep = Preparation("x", former)  # in the current generation, not in the prepared one
    prep.update(prepared())
    assert prep.switch_to() == 0 and not former.gates
    prep.update(prepared(go=True))
    assert prep.switch_to() == 5
    assert prep.take(5) == (prepared(go=True), None)


def test_a_dropped_or_replaced_preparation_closes_its_group_when_formed():
    former = Former()
    prep = Preparation("a", former)
    prep.update(prepared(5))
    former.release(5)
    wait_until(lambda: 5 in former.formed)
    prep.update(prepared(6))  # re-planned: 5's group is closed, 6 forms
    assert former.formed[5].closed
    prep.update(None)  # dropped while 6 forms: closed once it is done
    former.release(6)
    wait_until(lambda: 6 in former.formed and former.formed[6].closed)
    assert prep.switch_to() == 0


def test_a_group_that_did_not_form_never_switches():
    former = Former()
    former.fail.add(5)
    prep = Preparation("a", former)
    prep.update(prepared(5, go=True))
    former.release(5)
    threading.Event().wait(0.1)
    assert prep.switch_to() == 0


def test_after_a_new_master_a_prepared_generation_with_a_smaller_id_is_prepared_too():
    """A restarted master numbers its generations from 1 again: its prepared generation 2 is not one this
    trainer took already (it took 7 from the old master). Before, it was ignored until the master gave up
    on it (15 s), and a drain or a scale-up after every master restart waited that long."""
    former = Former()
    prep = Preparation("a", former)
    prep.update(prepared(7, go=True))
    former.release(7)
    wait_until(lambda: prep.switch_to() == 7)
    prep.take(7)
    prep.update(prepared(2))
    assert prep.switch_to() == 0 and 2 not in former.gates  # ignored: an id already taken, as far as it knows
    prep.reset()  # re-registered with the new master
    prep.update(prepared(2, go=True))
    former.release(2)
    wait_until(lambda: prep.switch_to() == 2)
    assert prep.take(2)[1] is former.formed[2]
