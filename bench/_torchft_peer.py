"""The torchft peer: one replica group of one process training the torchrun peer's MLP (_torch_ddp.py)
with torchft 0.2.0's per-step fault tolerance, as torchft's train_ddp.py example does it on CPUs:
``ProcessGroupGloo``, ``torchft.DistributedDataParallel``, ``torchft.Optimizer`` (OptimizerWrapper)
and a ``Manager`` that asks the lighthouse for a quorum at every step and heals a (re)joining replica
from a live one (checkpoint transfer, torchft's default HTTP transport).

Every attempted step appends ``<step> <time.monotonic()> <committed 0|1> <participants>`` to
``steps-r<replica>.log``: Linux's monotonic clock is one for all processes, so the benchmark compares
these times with its own. The pid goes to ``pid-r<replica>``, the time the manager came up to
``ready-r<replica>``.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects (dist.GradBucket).
import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torchft
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _torch_ddp import batch_at, mlp, shard  # noqa: E402


class DistributedDataParallel(torchft.DistributedDataParallel):
    """torchft's DDP wrapper with its communication hook mended for a peer that dies mid all-reduce.

    In torchft 0.2.0 (and its main branch as of this writing) the hook waits on the manager's all-reduce
    and hands DDP the work's future; when Gloo's wait raises (the peer's connection reset), the work
    reports the error to the manager but never sets that future, and the hook's ``assert fut._fut``
    kills the survivor with an AssertionError (measured here: the survivor of a SIGKILLed replica
    died so, at its first step after the kill). Manager.allreduce promises the opposite (an error is
    recorded and the step skipped, the future completing without it), so this hook keeps that promise:
    it completes with the bucket as it is, and should_commit() (the manager has the error) discards the
    step."""

    @staticmethod
    def _comm_hook(state: torchft.Manager, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        work = state.allreduce(bucket.buffer())
        work.wait()
        managed = work.get_future()
        # A _ManagedFuture wraps the torch future; after an error the manager returns a _DummyWork, whose
        # future is a completed torch future already (where torchft's hook fails on the missing ``_fut``).
        fut = getattr(managed, "_fut", managed)
        if fut is None:  # the work that failed (its error reported to the manager) has no future
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
        return fut


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--replica", type=int, required=True, help="this replica group's index (its data shard)")
    p.add_argument("--shards", type=int, required=True, help="how many shards the data is cut into")
    p.add_argument("--lighthouse", required=True, help="http://host:port of the torchft lighthouse")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=1_000_000)
    # train_ddp.py's values: a collective waits 5 s for a peer (Gloo), the manager's RPCs and the checkpoint 30 s
    p.add_argument("--pg-timeout", type=float, default=5.0)
    p.add_argument("--timeout", type=float, default=30.0)
    return p.parse_args()


def main() -> None:
    a = parse()
    torch.set_num_threads(1)
    work = Path(a.workdir)
    # Model and data first: once the manager heartbeats, the lighthouse counts this replica as healthy
    # and holds the others' next quorum for it (up to its join timeout) until it asks for one itself.
    torch.manual_seed(0)
    model = mlp()
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = shard(Path(a.data), a.replica, a.shards)

    def load_state(state: dict) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["opt"])

    def state() -> dict:
        return {"model": model.state_dict(), "opt": inner.state_dict()}

    # The group's own store (a group of one process): the manager and the quorum's Gloo rendezvous use it.
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    manager = torchft.Manager(
        pg=torchft.ProcessGroupGloo(timeout=timedelta(seconds=a.pg_timeout)),
        load_state_dict=load_state, state_dict=state, min_replica_size=1,
        timeout=timedelta(seconds=a.timeout), rank=0, world_size=1,
        store_addr="localhost", store_port=store.port, lighthouse_addr=a.lighthouse,
        replica_id=f"replica_{a.replica}", hostname="localhost")
    # When the manager came up (it heartbeats from now on): the benchmark tells torchft's part of a
    # (re)start, the quorum and the heal, from the interpreter's and torch's start.
    (work / f"ready-r{a.replica}").write_text(f"{time.monotonic():.6f}")
    ddp = DistributedDataParallel(manager, model)
    opt = torchft.Optimizer(manager, inner)
    (work / f"pid-r{a.replica}").write_text(str(os.getpid()))
    with (work / f"steps-r{a.replica}.log").open("a", buffering=1) as log:
        while manager.current_step() < a.steps:
            opt.zero_grad()  # starts the step's quorum (in the background)
            xb, yb = batch_at(x, y, manager.current_step(), a.batch_size)
            loss = nn.functional.cross_entropy(ddp(xb), yb)
            loss.backward()  # the all-reduce waited for the quorum, a heal's step included
            before = manager.current_step()
            opt.step()  # steps the optimizer only if every participant committed
            committed = manager.current_step() > before
            log.write(f"{manager.current_step()} {time.monotonic():.6f} {int(committed)} {manager.num_participants()}\n")
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
