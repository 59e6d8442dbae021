"""Process groups for one generation: the only module that touches ``paddle.base.core``.

Paddle's public ``init_parallel_env`` cannot be called twice in a process, but a
process group built directly on a fresh ``TCPStore`` can be created and dropped
at will. That is what lets survivors re-form the group in-process when the
membership changes. Gloo serves CPUs; NCCL serves GPUs through the same calls
(the NCCL branch needs a CUDA build of Paddle; it is untested on this CPU-only
machine).
"""

from __future__ import annotations

import gc
import os
import queue
import socket
import threading
import time
from concurrent.futures import Future
from typing import Callable, TypeVar

import paddle

from edl.errors import CollectiveError

T = TypeVar("T")


class Abandoned(CollectiveError):
    """The loop left a collective that can no longer complete (the master aborted its generation)."""


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


def _wait_listening(host: str, port: int, deadline: float) -> None:
    # Paddle's TCPStore client retries every 3 s when the server is not up yet;
    # probing the port ourselves keeps the rendezvous in the tens of milliseconds.
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.01)
    raise CollectiveError(f"rendezvous {host}:{port} did not come up")


class Group:
    """One generation's collective: all-reduce (sum) and broadcast."""

    def __init__(self, host: str, port: int, rank: int, world: int, group_id: int, backend: str = "gloo",
                 timeout_s: int = 10) -> None:
        self.rank, self.world = rank, world
        self._pg = None
        self._store = None
        self._abandoned = False
        if world == 1:
            return
        from paddle.base import core

        os.environ["PADDLE_TRAINER_ID"] = str(rank)  # read by the C++ side
        os.environ["PADDLE_TRAINERS_NUM"] = str(world)
        deadline = time.monotonic() + timeout_s
        try:
            if rank != 0:
                _wait_listening(host, port, deadline)
            # Paddle's store client writes each request in several small pieces (command, key length,
            # key, value) on a socket that keeps Nagle's algorithm on, so every piece after the first
            # waits for the store's delayed ACK (40 ms on Linux): Gloo's rendezvous, a few requests per
            # peer, took about 0.35 s per peer that way. So the store is made without its own
            # barrier (world 0: no requests inside the constructor; Gloo's rendezvous waits on every
            # peer's key anyway, and rank 0 is known to listen before the others connect), and its
            # connection gets TCP_NODELAY before the first request.
            self._store = core.TCPStore(host, port, rank == 0, 0, timeout_s)
            no_delay(store_sockets(host, port))
            gid = group_id  # must be the same on every rank: derived from the generation
            if backend == "gloo":
                self._pg = core.ProcessGroupGloo.create(self._store, rank, world, gid)
            elif backend == "nccl":
                self._pg = core.ProcessGroupNCCL.create(self._store, rank, world, gid, timeout_s * 1000, 0, None)
            else:
                raise ValueError(f"unknown collective backend {backend!r}")
        except CollectiveError:
            raise
        except Exception as e:  # noqa: BLE001 - Paddle raises RuntimeError/OSError subclasses
            self.close()
            raise CollectiveError(f"forming group at {host}:{port} failed: {e}") from e

    def _check(self) -> None:
        if self._abandoned:
            raise Abandoned("the generation was aborted")

    def all_reduce_sum(self, t: paddle.Tensor) -> None:
        self._check()
        if self._pg is None:
            return
        from paddle.base import core

        try:
            self._pg.all_reduce(t, core.ReduceOp.SUM, True)
        except Exception as e:  # noqa: BLE001
            self.close()  # closing our sockets makes peers blocked on us fail fast too
            raise CollectiveError(f"all-reduce failed: {str(e).splitlines()[0][:200]}") from e

    def broadcast(self, t: paddle.Tensor, src: int = 0) -> None:
        self._check()
        if self._pg is None:
            return
        try:
            self._pg.broadcast(t, src, True)
        except Exception as e:  # noqa: BLE001
            self.close()
            raise CollectiveError(f"broadcast failed: {str(e).splitlines()[0][:200]}") from e

    def abandon(self) -> None:
        """Every later call raises ``Abandoned``; the call in flight (on the runner's thread) keeps the
        process group alive until Gloo gives up on it, but nothing it does reaches this generation."""
        self._abandoned = True

    def close(self) -> None:
        self._pg = None
        self._store = None
        gc.collect()


class Runner:
    """Runs the loop's blocking collectives on a thread of their own, so that the loop can leave one.

    Paddle's Gloo calls cannot be interrupted, and closing a group from another thread does not
    wake a peer blocked on it: a survivor waiting on another survivor that already gave up would
    wait out Gloo's timeout. So the loop waits on the call here, watching ``abort`` (the master's
    word that the generation failed), and on abort leaves the call to its thread (a daemon, which
    ends when Gloo does) and takes a fresh thread for the next generation.
    """

    def __init__(self, poll_s: float = 0.005) -> None:
        self.poll_s = poll_s
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future]] | None = None
        self._queued: list[Future] = []  # handed to the current thread and maybe not done yet
        self.abandoned = 0  # calls left behind, for the log

    def _serve(self, jobs: queue.SimpleQueue[tuple[Callable[[], object], Future]]) -> None:
        while True:
            fn, fut = jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting loop as is
                fut.set_exception(e)

    def submit(self, fn: Callable[[], T]) -> Future:
        """Queue ``fn`` on the collectives' thread without waiting: calls run one at a time, in the order
        submitted (so a call that finished means every call submitted before it finished too)."""
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(self._jobs,), name="edl-collective", daemon=True).start()
        self._queued = [f for f in self._queued if not f.done()]
        fut: Future = Future()
        self._queued.append(fut)
        self._jobs.put((fn, fut))
        return fut

    def run(self, fn: Callable[[], T], abort: Callable[[], bool], group: Group | None = None) -> T:
        """``fn()``, or ``Abandoned`` as soon as ``abort()`` holds while it runs (``group`` is abandoned too)."""
        if abort():
            if group is not None:
                group.abandon()
            raise Abandoned("the generation was aborted")
        return self.wait(self.submit(fn), abort, group)

    def wait(self, fut: Future, abort: Callable[[], bool], group: Group | None = None) -> T:
        """The result of a submitted call, or ``Abandoned`` as soon as ``abort()`` holds while the thread
        works on it or on a call before it: the calls not started are cancelled, and a call already
        running is left to its thread (the next call gets a fresh one)."""
        while True:
            try:
                return fut.result(timeout=self.poll_s)  # type: ignore[no-any-return]
            except TimeoutError:
                pass
            if abort():
                if group is not None:
                    group.abandon()
                running = [f for f in self._queued if not f.cancel() and not f.done()]
                self._queued = []
                if running:  # its thread stays with it
                    self._jobs = None
                    self.abandoned += 1
                raise Abandoned("the generation was aborted while in its collective")
