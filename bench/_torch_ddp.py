"""The torchrun and DLRover peers: the same MLP trained with DistributedDataParallel under the
restart-all elasticity of torchrun (or dlrover-run, which extends it). Rank 0 logs the wall time of
every completed step and the restart round; every rank writes its pid so the benchmark can kill one.
Resumes from a snapshot after a restart, as torchrun's documentation recommends. The torchft peer
(_torchft_peer.py) imports the network and the data from here.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from torch import nn


def load(data: Path) -> tuple[np.ndarray, np.ndarray]:
    tables = [pq.read_table(p) for p in sorted(data.glob("*.parquet"))]
    feats = np.concatenate([np.asarray(t.column("features").combine_chunks().values).reshape(len(t), -1) for t in tables])
    labels = np.concatenate([t.column("label").to_numpy() for t in tables])
    return feats.astype(np.float32), labels.astype(np.int64)


def mlp() -> nn.Module:
    """edl.zoo.torch.mlp's network; the torchft and DLRover peers import it from here too."""
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def shard(data: Path, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's records, every ``world``-th one, held in memory."""
    x, y = load(data)
    return torch.from_numpy(x[rank::world]), torch.from_numpy(y[rank::world])


def batch_at(x: torch.Tensor, y: torch.Tensor, step: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``step``: a window that walks through the shard, the same on every restart."""
    lo = (step * b) % (len(x) - b)
    return x[lo : lo + b], y[lo : lo + b]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--snapshot-every", type=int, default=20, help="steps between snapshots; 0: none (throughput)")
    p.add_argument("--progress", help="rank 0 writes its step count here after every step (throughput.py)")
    a = p.parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torchrun's agent hosts the workers' store (TORCHELASTIC_USE_AGENT_STORE=True); DLRover's agent keeps
    # its rendezvous in its master, so there rank 0 hosts the store, as init_process_group's env:// does.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    # One key prefix per restart round: the agent's store outlives the workers, and gloo's
    # rendezvous keys from the previous round would otherwise point at dead workers.
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         is_master=rank == 0 and not agent_store)
    store = dist.PrefixStore(f"round-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", base)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    work = Path(a.workdir)
    (work / f"pid-{rank}").write_text(str(os.getpid()))
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = 0
    snap = work / "snapshot.pt"
    if snap.exists():
        state = torch.load(snap)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    ddp = nn.parallel.DistributedDataParallel(model)
    x, y = shard(Path(a.data), rank, world)
    log = (work / "steps.log").open("a", buffering=1) if rank == 0 and not a.progress else None
    progress = open(a.progress, "w") if rank == 0 and a.progress else None
    agent = os.getppid()
    while step < a.steps and os.getppid() == agent:  # torchrun's agent gone (the bench killed it): stop
        xb, yb = batch_at(x, y, step, a.batch_size)
        loss = nn.functional.cross_entropy(ddp(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if progress is not None:
            progress.seek(0)
            progress.write(f"{step:12d}")
            progress.flush()
        if log:
            log.write(f"{step} {time.time()} {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}\n")
        if rank == 0 and a.snapshot_every and step % a.snapshot_every == 0:
            tmp = work / "snapshot.tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, snap)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
