"""PyTorch's process groups for one generation: a ``TCPStore`` and a Gloo (CPU) or NCCL (GPU) group.

``torch.distributed.init_process_group`` makes one global default group per process; a
generation's group is instead constructed directly on a store of its own, so survivors drop
it and form the next one in-process when the membership changes. The store's keys are
prefixed with the group's id. The NCCL branch needs a GPU; it is not run on a CPU-only machine.
"""

from __future__ import annotations

import gc
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from edl.errors import Abandoned, CollectiveError
from edl.frameworks.rendezvous import wait_listening


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


class TorchGroup:
    """One generation's collective: all-reduce (sum) and broadcast."""

    def __init__(self, host: str, port: int, rank: int, world: int, group_id: int, backend: str = "gloo",
                 timeout_s: int = 10) -> None:
        self.rank, self.world = rank, world
        self._pg: dist.ProcessGroup | None = None
        self._store: dist.Store | None = None
        self._abandoned = False
        if world == 1:
            return
        timeout = timedelta(seconds=timeout_s)
        try:
            if rank != 0:
                wait_listening(host, port, time.monotonic() + timeout_s)
            self._store = dist.TCPStore(host, port, world, rank == 0, timeout, wait_for_workers=False)
            store = dist.PrefixStore(f"edl/{group_id}/", self._store)
            if backend == "gloo":
                self._pg = dist.ProcessGroupGloo(store, rank, world, timeout)
            elif backend == "nccl":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                self._pg = dist.ProcessGroupNCCL(store, rank, world, opts)
            else:
                raise ValueError(f"unknown collective backend {backend!r}")
        except CollectiveError:
            raise
        except Exception as e:  # noqa: BLE001 - c10d raises RuntimeError subclasses (DistError, DistStoreError)
            self.close()
            raise CollectiveError(f"forming group at {host}:{port} failed: {_first_line(e)}") from e

    def _check(self) -> None:
        if self._abandoned:
            raise Abandoned("the generation was aborted")

    def all_reduce_sum(self, t: torch.Tensor) -> None:
        self._check()
        if self._pg is None:
            return
        try:
            self._pg.allreduce([t]).wait()
        except Exception as e:  # noqa: BLE001
            self.close()  # closing our sockets makes peers blocked on us fail fast too
            raise CollectiveError(f"all-reduce failed: {_first_line(e)}") from e

    def broadcast(self, t: torch.Tensor, src: int = 0) -> None:
        self._check()
        if self._pg is None:
            return
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        try:
            self._pg.broadcast([t], opts).wait()
        except Exception as e:  # noqa: BLE001
            self.close()
            raise CollectiveError(f"broadcast failed: {_first_line(e)}") from e

    def abandon(self) -> None:
        """Every later call raises ``Abandoned``; the call in flight (on the runner's thread) keeps the
        group alive until Gloo gives up on it, but nothing it does reaches this generation."""
        self._abandoned = True

    def close(self) -> None:
        self._pg = None
        self._store = None
        gc.collect()
