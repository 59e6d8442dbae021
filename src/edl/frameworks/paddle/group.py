"""PaddlePaddle's process groups for one generation: the only module that touches ``paddle.base.core``.

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
import time

import paddle

from edl.errors import Abandoned, CollectiveError
from edl.frameworks.rendezvous import no_delay, store_sockets, wait_listening


class PaddleGroup:
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
                wait_listening(host, port, deadline)
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
