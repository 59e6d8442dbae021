"""edl's PyTorch step against DistributedDataParallel's, in a bare loop: where the throughput gap is.

    python bench/step_loop.py [--rounds 6] [--steps 200] [--batch-size 256]

Two processes train ``edl.zoo.torch.mlp`` on the same in-memory batches, one thread each, in turns:
DDP on a Gloo group (``init_process_group``), then edl's replica and group as the trainer drives them
(``begin_step``, backward streaming its buckets to a ``Runner``'s thread, ``reduce_rest`` with the step's
slots, ``end_step``), with no master, data reading or bookkeeping. ``bench/throughput.py`` measures the
whole ``edl train`` against torchrun; this one isolates the framework seam, so that the difference between
the two ratios is what the rest of the trainer's loop costs. Prints a table and writes
bench/results/step_loop.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

from edl.net import free_port  # noqa: E402

CONTENDERS = ("ddp", "edl")


def worker(mode: str, rank: int, port: int, steps: int, batch: int) -> None:
    """One rank of one turn: ``steps`` timed steps after 20 untimed; rank 0 prints steps per second."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn

    from edl.modeldef import load_model_def

    torch.set_num_threads(1)
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((batch * 64, 256), dtype=np.float32)
    y = rng.integers(0, 10, batch * 64)
    md = load_model_def("edl.zoo.torch.mlp")
    if mode == "ddp":
        store = dist.TCPStore("127.0.0.1", port, 2, rank == 0)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
        torch.manual_seed(0)
        model = md.model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        ddp = nn.parallel.DistributedDataParallel(model)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)

        def step(i: int) -> None:
            lo = (i * batch) % (len(x) - batch)
            loss = nn.functional.cross_entropy(ddp(xt[lo:lo + batch]), yt[lo:lo + batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
    else:
        from edl.frameworks import load
        from edl.trainer.collective import Runner
        from edl.trainer.slots import SLOT

        fw = load("torch")
        group = fw.group("127.0.0.1", port, rank, 2, 1, "gloo")
        replica = fw.replica(md, 0, 0.01, None)
        runner = Runner()
        replica.warm_up(x[:batch], y[:batch])
        slots = np.zeros(2 * SLOT, np.float32)

        def step(i: int) -> None:
            lo = (i * batch) % (len(x) - batch)
            replica.begin_step(group, len(slots), runner.submit)
            replica.backward(x[lo:lo + batch], y[lo:lo + batch])
            runner.wait(replica.reduce_rest(group, slots, runner.submit), lambda: False)
            replica.end_step(2 * batch)

    for i in range(20):
        step(i)
    t = time.perf_counter()
    for i in range(steps):
        step(i)
    if rank == 0:
        print(steps / (time.perf_counter() - t), flush=True)


def turn(mode: str, steps: int, batch: int) -> float:
    """Both ranks of one contender; answers rank 0's steps per second."""
    port = free_port("127.0.0.1")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, __file__, "--worker", mode, "--port", str(port), "--steps", str(steps),
            "--batch-size", str(batch)]
    other = subprocess.Popen([*args, "--rank", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out = subprocess.run([*args, "--rank", "0"], env=env, capture_output=True, text=True, timeout=600, check=True)
    finally:
        other.wait(60)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description="edl's PyTorch step vs DDP's in a bare two-process loop (interleaved)")
    p.add_argument("--rounds", type=int, default=6, help="turns per contender, alternating (default 6)")
    p.add_argument("--steps", type=int, default=200, help="timed steps per turn, after 20 untimed (default 200)")
    p.add_argument("--batch-size", type=int, default=256, help="records per worker per step (default 256)")
    p.add_argument("--worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.worker, a.rank, a.port, a.steps, a.batch_size)
        return 0
    console = Console()
    rates: dict[str, list[float]] = {m: [] for m in CONTENDERS}
    for r in range(a.rounds):
        for mode in CONTENDERS:
            rates[mode].append(turn(mode, a.steps, a.batch_size))
        console.print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{m} {rates[m][-1]:.2f} steps/s" for m in CONTENDERS))
    per_round = [e / d for e, d in zip(rates["edl"], rates["ddp"])]
    result = {"model": "edl.zoo.torch.mlp", "batch_per_worker": a.batch_size, "workers": 2, "steps": a.steps,
              "steps_per_s": rates, "edl_over_ddp_per_round": per_round,
              "edl_over_ddp_median_round": statistics.median(per_round),
              "edl_over_ddp": statistics.mean(rates["edl"]) / statistics.mean(rates["ddp"])}
    path = write_result("step_loop", result)
    t = Table(title=f"a bare step loop, 2 workers, {a.rounds} interleaved rounds of {a.steps} steps")
    t.add_column("contender")
    t.add_column("steps/s (mean)", justify="right")
    t.add_column("ratio to DDP", justify="right")
    base = statistics.mean(rates["ddp"])
    for m, name in (("ddp", "DistributedDataParallel"), ("edl", "edl's replica and group")):
        t.add_row(name, f"{statistics.mean(rates[m]):.2f}", f"{statistics.mean(rates[m]) / base:.3f}")
    console.print(t)
    console.print(f"edl / DDP per round {min(per_round):.3f}..{max(per_round):.3f}, median "
                  f"{result['edl_over_ddp_median_round']:.3f}; written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
