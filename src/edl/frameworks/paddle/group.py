"""PaddlePaddle's process groups for one generation: the only module that touches ``paddle.base.core``.

Paddle's public ``init_parallel_env`` cannot be called twice in a process, but a
process group built directly on a fresh ``TCPStore`` can be created and dropped
at will. That is what lets survivors re-form the group in-process when the
membership changes. Gloo serves CPUs; NCCL serves GPUs through the same calls
(the NCCL branch needs a CUDA build of Paddle; it is untested on this CPU-only
machine).
"""

from __future__ import annotations

import os
import time

import paddle

from edl.errors import CollectiveError
from edl.frameworks.rendezvous import CollectiveGroup, no_delay, store_sockets, wait_listening


class PaddleGroup(CollectiveGroup):
    """One generation's collective: all-reduce (sum) and broadcast."""

    def __init__(self, host: str, port: int, rank: int, world: int, group_id: int, backend: str = "gloo",
                 timeout_s: int = 10) -> None:
        super().__init__(rank, world)
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
                self._pg = core.ProcessGroupNCCL.create(  # type: ignore[attr-defined]  # GPU builds only
                    self._store, rank, world, gid, timeout_s * 1000, 0, None)
            else:
                raise ValueError(f"unknown collective backend {backend!r}")
        except CollectiveError:
            raise
        except Exception as e:  # noqa: BLE001 - Paddle raises RuntimeError/OSError subclasses
            self.close()
            raise CollectiveError(f"forming group at {host}:{port} failed: {e}") from e

    def all_reduce_sum(self, t: paddle.Tensor) -> None:
        from paddle.base import core

        self._call("all-reduce", lambda: self._pg.all_reduce(t, core.ReduceOp.SUM, True))

    def broadcast(self, t: paddle.Tensor, src: int = 0) -> None:
        self._call("broadcast", lambda: self._pg.broadcast(t, src, True))
