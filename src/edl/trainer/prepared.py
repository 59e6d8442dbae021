"""The prepared generation a trainer will switch into, and its collective, formed in the background.

The master announces the next generation of a graceful change while the current one trains on
(``edl.api.master.Prepared``, in every heartbeat answer). A member of it forms its collective on a
thread of its own and tells the master once it has; a member of the current generation that is not
in it (a drained one) has nothing to form. Once the master gives the go, the loop puts the prepared
generation's id into its step's slot (``switch_to``), and after the first step at which every rank
did, all switch together: the group is taken from here, ready. A preparation the master drops or
replaces is dropped here too: a group that formed is closed, one still forming is closed when it
is done (its thread ends when Gloo gives up on the peers that never came).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Callable

from edl.api.master import Prepared
from edl.errors import EdlError
from edl.api.framework import Group

log = logging.getLogger("edl.trainer")


def _close_when_formed(fut: Future) -> None:
    def close(f: Future) -> None:
        if f.exception() is None:
            f.result().close()

    fut.add_done_callback(close)


class Preparation:
    """The prepared generation this trainer is in or leaves at, and its group. Thread-safe: the heartbeat
    thread updates it with every answer, the training loop reads it at every step."""

    def __init__(self, trainer_id: str, form: Callable[[Prepared], Group]) -> None:
        self.id = trainer_id
        self._form = form  # forms the prepared generation's group and tells the master (blocking)
        self._lock = threading.Lock()
        self._prepared: Prepared | None = None
        self._group: Future | None = None  # None: nothing to form (we leave at the switch)
        self._taken = 0  # the newest prepared generation switched into: answers may still name it

    def update(self, prepared: Prepared | None) -> None:
        """The master's latest word on the prepared generation (None: none)."""
        with self._lock:
            if self._prepared is not None and (prepared is None or prepared.generation != self._prepared.generation):
                self._drop()
            if prepared is None or prepared.generation <= self._taken:
                return
            if self._prepared is None:
                self._group = self._start(prepared) if self.id in prepared.members else None
            self._prepared = prepared

    def reset(self) -> None:
        """A new master (this trainer re-registered): it numbers its generations afresh, so a prepared one of
        it may have a smaller id than the last one taken from the old master; drop what that one prepared."""
        with self._lock:
            if self._prepared is not None:
                self._drop()
            self._taken = 0

    def _start(self, prepared: Prepared) -> Future:
        fut: Future = Future()

        def run() -> None:
            try:
                fut.set_result(self._form(prepared))
            except EdlError as e:  # a peer never came (the master re-plans), or the master is away
                log.debug("trainer %s: preparing generation %d: %s", self.id, prepared.generation, e)
                fut.set_exception(e)
            except BaseException as e:  # noqa: BLE001 - handed to whoever takes the group
                fut.set_exception(e)

        threading.Thread(target=run, name=f"edl-prepare-{prepared.generation}", daemon=True).start()
        return fut

    def _drop(self) -> None:
        if self._group is not None:
            _close_when_formed(self._group)
        self._prepared, self._group = None, None

    def switch_to(self) -> int:
        """The prepared generation to switch into after this step, if the master gave the go and our part is
        done (its group formed, or we leave there); else 0."""
        with self._lock:
            p = self._prepared
            if p is None or not p.go:
                return 0
            if self._group is None or (self._group.done() and self._group.exception() is None):
                return p.generation
            return 0

    def take(self, generation: int) -> tuple[Prepared, Group | None]:
        """The prepared ``generation`` and its formed group (None: we leave there), no longer held here."""
        with self._lock:
            p, fut = self._prepared, self._group
            assert p is not None and p.generation == generation, f"no prepared generation {generation}"
            self._prepared, self._group, self._taken = None, None, generation
        return p, None if fut is None else fut.result()
