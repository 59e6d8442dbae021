"""Plain PaddlePaddle data parallel, the baseline: run under ``python -m paddle.distributed.launch``.

Same model (edl.zoo.mlp), batch per process and data as the edl run; prints one
JSON line with steady-state samples/s measured on rank 0.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import paddle
import paddle.distributed as dist

from edl.data.dataset import Dataset
from edl.zoo import mlp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--warmup", type=float, default=8.0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    paddle.seed(0)
    model = paddle.DataParallel(mlp.model())
    opt = mlp.optimizer(model.parameters(), 0.01)
    x, y = mlp.collate(Dataset(a.data).read_all())
    x, y = x[rank::world], y[rank::world]
    n, b = len(x), a.batch_size
    i = 0
    t_start = time.monotonic()
    measured = 0
    t_measure = None
    while True:
        lo = (i * b) % (n - b)
        out = model(paddle.to_tensor(x[lo : lo + b]))
        loss = mlp.loss(out, paddle.to_tensor(y[lo : lo + b]))
        loss.backward()
        opt.step()
        opt.clear_grad()
        i += 1
        now = time.monotonic()
        if t_measure is None and now - t_start >= a.warmup:
            t_measure, measured = now, 0
        elif t_measure is not None:
            measured += 1
            if now - t_measure >= a.seconds:
                break
    elapsed = time.monotonic() - t_measure
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump({"samples_per_s": measured * b * world / elapsed, "steps": measured, "seconds": elapsed,
                       "loss": float(loss)}, f)


if __name__ == "__main__":
    main()
