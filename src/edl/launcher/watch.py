"""The launcher's copy of its master's status, kept fresh by a long poll on a thread of its own.

The launcher's loop comes round ten times a second, so that it sees a trainer's exit at once; it
used to read the master's whole status on each round, which cost the launcher and the master
together about 40 ms of CPU per training step on a 2-core machine (``bench/throughput.py``), CPU
that the trainers beside them did not get. The launcher acts on a few things of the status (the
desired count, the trainers the master knows, the phase, the job's end: ``Job.control_key``) and
only shows the rest (the step, the rows done). So this thread asks with the version of what it last
got (``JobView.control_version``), and the master answers once one of those has changed, or after
``wait_s`` (what is shown is then at most that old). The loop reads this copy, and reads the master
itself where a copy could be too old: after it acted, or when its trainers changed (``Launcher``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Protocol

from edl.api.cluster import MasterEndpoint
from edl.api.master import JobView
from edl.errors import EdlError

log = logging.getLogger("edl.launcher")

WATCH_WAIT_S = 1.0  # the longest a long poll waits: what the launcher shows is at most this old
RETRY_S = 0.1  # a master that did not answer is asked again this soon (the launcher's round)


class StatusSource(Protocol):
    """A link to a master that answers long polls of its status (``HttpMaster``)."""

    def status(self, after: int = 0, wait_s: float = 0.0) -> JobView | None: ...


@dataclass(frozen=True)
class Reading:
    """One answer of the watched master."""

    endpoint: MasterEndpoint  # the master that answered (a replaced master's readings are not used)
    view: JobView | None  # None: it did not answer (unreachable, restarting, 5xx)
    error: EdlError | None = None  # it refused (a wrong token): the launcher's loop raises this
    serial: int = 0  # counts the readings: a new one has a higher serial


class StatusWatch:
    """Long-polls the master at the endpoint it follows; ``latest`` is its newest reading. Thread-safe."""

    def __init__(self, connect: Callable[[MasterEndpoint], StatusSource], wait_s: float = WATCH_WAIT_S,
                 retry_s: float = RETRY_S) -> None:
        self.connect = connect  # a link of its own: its long poll holds a connection
        self.wait_s = wait_s
        self.retry_s = retry_s
        self._lock = threading.Lock()
        self._new = threading.Condition(self._lock)
        self._endpoint: MasterEndpoint | None = None
        self._latest: Reading | None = None
        self._serial = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, endpoint: MasterEndpoint) -> None:
        """Watch the master at ``endpoint`` from now on (a replaced master: nothing of the old one is kept);
        starts the thread on the first call."""
        with self._lock:
            if endpoint != self._endpoint:
                self._endpoint, self._latest = endpoint, None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="edl-status-watch", daemon=True)
                self._thread.start()

    def latest(self) -> Reading | None:
        """The newest reading of the followed master (``None`` before its first)."""
        with self._lock:
            return self._latest

    def latest_serial(self) -> int:
        """The serial of the newest reading (0: none yet)."""
        with self._lock:
            return self._serial

    def wait_newer(self, serial: int, timeout_s: float) -> None:
        """Until a reading newer than ``serial`` is there, or ``timeout_s`` has passed."""
        with self._new:
            self._new.wait_for(lambda: self._latest is not None and self._latest.serial > serial, timeout_s)

    def stop(self) -> None:
        self._stop.set()

    def _publish(self, endpoint: MasterEndpoint, view: JobView | None, error: EdlError | None) -> None:
        with self._new:
            if endpoint != self._endpoint:
                return  # the launcher moved on to another master meanwhile
            self._serial += 1
            self._latest = Reading(endpoint, view, error, self._serial)
            self._new.notify_all()

    def _run(self) -> None:
        link: StatusSource | None = None
        at: MasterEndpoint | None = None
        after = 0  # the version of the last answer (0: none): the next poll waits for a change from it
        while not self._stop.is_set():
            with self._lock:
                endpoint = self._endpoint
            if endpoint is None:
                return
            if endpoint != at:
                link, at, after = self.connect(endpoint), endpoint, 0
            assert link is not None
            try:
                view, error = link.status(after=after, wait_s=self.wait_s if after else 0.0), None
            except EdlError as e:
                view, error = None, e
            except Exception as e:  # noqa: BLE001 - a bug here must not end the watch silently: the loop hears of it
                log.exception("status watch")
                view, error = None, EdlError(f"status watch: {type(e).__name__}: {e}")
            self._publish(endpoint, view, error)
            if view is None or not view.control_version:
                # Unanswered, refused, or a master that does not long-poll: ask again at the launcher's pace.
                after = 0
                self._stop.wait(self.retry_s)
            else:
                after = view.control_version
