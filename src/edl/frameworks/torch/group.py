"""PyTorch's process groups for one generation: a ``TCPStore`` and a Gloo (CPU) or NCCL (GPU) group.

``torch.distributed.init_process_group`` makes one global default group per process; a
generation's group is instead constructed directly on a store of its own, so survivors drop
it and form the next one in-process when the membership changes. The store's keys are
prefixed with the group's id. The NCCL branch needs a GPU; it is not run on a CPU-only machine.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from edl.errors import CollectiveError
from edl.frameworks.rendezvous import CollectiveGroup, first_line, wait_listening


class TorchGroup(CollectiveGroup):
    """One generation's collective: all-reduce (sum) and broadcast."""

    def __init__(self, host: str, port: int, rank: int, world: int, group_id: int, backend: str = "gloo",
                 timeout_s: int = 10) -> None:
        super().__init__(rank, world)
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
            raise CollectiveError(f"forming group at {host}:{port} failed: {first_line(e)}") from e

    def all_reduce_sum(self, t: torch.Tensor) -> None:
        self._call("all-reduce", lambda: self._pg.allreduce([t]).wait())

    def broadcast(self, t: torch.Tensor, src: int = 0) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        self._call("broadcast", lambda: self._pg.broadcast([t], opts).wait())
