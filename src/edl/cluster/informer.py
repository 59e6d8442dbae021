"""A watch-driven cache of one Kubernetes resource: list once, then follow the watch events."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Generic, Protocol, TypeVar

from edl.cluster.kube_api import ListWatch, WatchStream
from edl.errors import KubeExpiredError, KubeRefusedError, TemporaryError

log = logging.getLogger("edl.kubernetes")
T = TypeVar("T")
R = TypeVar("R")
T_contra = TypeVar("T_contra", contravariant=True)


class Index(Protocol[T_contra]):
    """Kept in step with the cache, under its lock (``edl.api.ledger.PodLedger``)."""

    def reset(self) -> None: ...

    def put(self, key: str, value: T_contra | None) -> None: ...


@dataclass
class _State(Generic[T]):
    items: dict[str, T]
    resource_version: str | None = None


class Informer(Generic[T]):
    """A watch-driven cache: list once, then apply watch events; list again on 410 Gone and after a
    failed list or watch (retried with backoff; one log line when the API is lost, one when it answers).

    ``decode`` turns an object into the cached value (or ``None`` to drop it). Keys
    are ``namespace/name``. Readers get a consistent copy of the values with
    ``values()``; ``healthy()`` says whether the cache reflects a recent list+watch.
    ``index``, if given, is told every change as it is applied.
    """

    BACKOFF_S = (0.5, 10.0)  # the first wait after a failure, and the longest

    def __init__(self, name: str, source: ListWatch, decode: Callable[[dict], T | None],
                 selector: str | None = None, page: int = 500, watch_timeout_s: int = 60,
                 index: Index[T] | None = None) -> None:
        self.name = name
        self.index = index
        self.source = source
        self.decode = decode
        self.selector = selector
        self.page = page
        self.watch_timeout_s = watch_timeout_s
        self._lock = threading.Lock()
        self._state: _State[T] = _State({})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: WatchStream | None = None
        self.lists = 0  # how many full lists were needed (1 plus one per 410)
        self.last_error: str | None = None
        self._failing_since: float | None = None  # monotonic: the API stopped answering then
        self._said_back = False  # that it answers again was logged

    @staticmethod
    def key(obj: dict) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"

    def relist(self) -> None:
        """A paginated list: a consistent snapshot and the resourceVersion to watch from."""
        items: dict[str, T] = {}
        token: str | None = None
        while True:
            body = self.source.page(self.selector, self.page, token)
            for obj in body.get("items") or []:
                value = self.decode(obj)
                if value is not None:
                    items[self.key(obj)] = value
            token = (body.get("metadata") or {}).get("continue")
            if not token or self._stop.is_set():  # stopped while listing: the pages so far are dropped below
                break
        if self._stop.is_set():
            return
        with self._lock:
            self._state = _State(items, body["metadata"]["resourceVersion"])
            if self.index is not None:
                self.index.reset()
                for key, value in items.items():
                    self.index.put(key, value)
        self.lists += 1
        self._answered(watched=False)
        log.debug("%s: listed %d objects at resourceVersion %s", self.name, len(items),
                  self._state.resource_version)

    def watch_once(self) -> None:
        """Apply one watch stream's events (until its timeout); raises ``KubeExpiredError`` when expired."""
        stream = self.source.watch(self.selector, self._state.resource_version, self.watch_timeout_s)
        self._watch = stream
        if self._stop.is_set():  # stopped while it opened: ``stop`` may have missed this stream
            stream.stop()
            return
        for kind, obj in stream:
            if self._stop.is_set():
                stream.stop()
                break
            if self._failing_since is not None:
                self._answered(watched=True)
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            with self._lock:
                key = self.key(obj) if kind in ("ADDED", "MODIFIED", "DELETED") else ""  # a BOOKMARK has no name
                if kind in ("ADDED", "MODIFIED"):
                    value = self.decode(obj)
                    if value is None:
                        self._state.items.pop(key, None)
                    else:
                        self._state.items[key] = value
                    if self.index is not None:
                        self.index.put(key, value)
                elif kind == "DELETED":
                    self._state.items.pop(key, None)
                    if self.index is not None:
                        self.index.put(key, None)
                if rv:
                    self._state.resource_version = rv

    def sync_step(self) -> None:
        """One round: list if needed, then watch. 410 Gone means: list again next round."""
        if self._state.resource_version is None:
            self.relist()
        try:
            self.watch_once()
        except KubeExpiredError:
            log.debug("%s: watch expired (410 Gone), listing again", self.name)
            with self._lock:
                self._state.resource_version = None

    def _run(self) -> None:
        backoff = self.BACKOFF_S[0]
        while not self._stop.is_set():
            try:
                self.sync_step()
                backoff = self.BACKOFF_S[0]
                self._answered(watched=True)
            except Exception as e:  # noqa: BLE001 - any failure: keep the cache, retry with backoff
                if not isinstance(e, (KubeRefusedError, TemporaryError)):
                    log.exception("%s: unexpected error", self.name)
                self.last_error = str(e).splitlines()[0] if str(e) else type(e).__name__
                with self._lock:  # list again: that it answers (and with what) is known at once, not at
                    self._state.resource_version = None  # a quiet watch's first event
                if self._failing_since is None:  # one line when the API is lost, one when it answers again
                    self._failing_since = time.monotonic()
                    log.warning("%s: %s; retrying with backoff", self.name, self.last_error)
                else:
                    log.debug("%s: %s; retrying in %.1f s", self.name, self.last_error, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.BACKOFF_S[1])

    def _answered(self, watched: bool) -> None:
        """The API answered: a list, or (``watched``) a watch event or a watch's end. One line says so
        after a failure; the next failure is told again only once a watch has worked (a list that works
        while its watch fails, a watch RBAC forbids, say, is not a line per retry)."""
        self.last_error = None
        if self._failing_since is not None and not self._said_back:
            log.info("%s: the API answers again after %.0f s", self.name, time.monotonic() - self._failing_since)
            self._said_back = True
        if watched:
            self._failing_since = None
            self._said_back = False

    def start(self) -> "Informer[T]":
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, wait_s: float = 0.5) -> None:
        """Stop following. A watch blocked on a quiet stream ends at its timeout; the thread is a
        daemon, so a process that exits does not wait for it."""
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout=wait_s)

    def values(self) -> list[T]:
        with self._lock:
            return list(self._state.items.values())

    def values_and(self, also: Callable[[], R]) -> tuple[list[T], R]:
        """``values()`` and what ``also`` reads (of the ``index``) at the same moment."""
        with self._lock:
            return list(self._state.items.values()), also()

    def get(self, key: str) -> T | None:
        with self._lock:
            return self._state.items.get(key)

    def healthy(self) -> bool:
        """Listed at least once and the last list or watch did not fail."""
        with self._lock:
            return self._state.resource_version is not None and self.last_error is None

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.healthy():
                return True
            time.sleep(0.05)
        return False
