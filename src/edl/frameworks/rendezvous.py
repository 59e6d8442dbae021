"""A generation's group, framework-neutral: waiting for rank 0's store, Nagle's algorithm off, and the
calls' common handling (``CollectiveGroup``)."""

from __future__ import annotations

import gc
import os
import socket
import time
from typing import Any, Callable

from edl.errors import Abandoned, CollectiveError


def first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


class CollectiveGroup:
    """What both frameworks' groups share: a world of one needs no process group, a failed call closes
    the group (closing our sockets makes peers blocked on us fail fast too) and raises
    ``CollectiveError``, and an abandoned group raises ``Abandoned``. Subclasses form ``_pg``."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self._pg: Any = None
        self._store: Any = None
        self._abandoned = False

    def _call(self, what: str, fn: Callable[[], object]) -> None:
        if self._abandoned:
            raise Abandoned("the generation was aborted")
        if self._pg is None:
            return  # a world of one: the sum and the broadcast are the tensor itself
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the frameworks raise RuntimeError subclasses of their own
            self.close()
            raise CollectiveError(f"{what} failed: {first_line(e)}") from e

    def abandon(self) -> None:
        """Every later call raises ``Abandoned``; the call in flight (on the runner's thread) keeps the
        process group alive until Gloo gives up on it, but nothing it does reaches this generation."""
        self._abandoned = True

    def close(self) -> None:
        self._pg = None
        self._store = None
        gc.collect()


def store_sockets(host: str, port: int) -> list[int]:
    """This process's file descriptors of TCP connections to the store at ``host:port``."""
    peer = (socket.gethostbyname(host), port)
    out: list[int] = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out  # no /proc (not Linux): the group still forms, with Nagle's delays
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(name)))  # a second descriptor of the same socket
        except OSError:
            continue  # closed meanwhile, or not ours to read
        try:
            if s.type == socket.SOCK_STREAM and s.family == socket.AF_INET and s.getpeername() == peer:
                out.append(int(name))
        except OSError:
            pass  # not connected
        finally:
            s.close()  # closes the duplicate only
    return out


def no_delay(fds: list[int]) -> None:
    """Turn Nagle's algorithm off on these TCP sockets."""
    for fd in fds:
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue  # closed since it was found
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # no longer a TCP socket: the number was reused
        finally:
            s.close()


def wait_listening(host: str, port: int, deadline: float) -> None:
    """Wait for rank 0's store to listen: Paddle's store client retries every 3 s when the server is
    not up yet (PyTorch's backs off too); probing the port ourselves keeps the rendezvous in the tens
    of milliseconds."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.01)
    raise CollectiveError(f"rendezvous {host}:{port} did not come up")
