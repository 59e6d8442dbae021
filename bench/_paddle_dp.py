"""Plain PaddlePaddle data parallel, the baseline: run under ``python -m paddle.distributed.launch``.

Same model (edl.zoo.mlp), batch per process and data as the edl run; rank 0
keeps its completed step count in a file that the benchmark reads.
"""

from __future__ import annotations

import argparse
import paddle
import paddle.distributed as dist

from edl.data.dataset import Dataset
from edl.zoo import mlp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--progress", required=True, help="rank 0 writes 'steps' here after every step")
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
    progress = open(a.progress, "w") if rank == 0 else None
    while True:  # until the benchmark kills us
        lo = (i * b) % (n - b)
        out = model(paddle.to_tensor(x[lo : lo + b]))
        loss = mlp.loss(out, paddle.to_tensor(y[lo : lo + b]))
        loss.backward()
        opt.step()
        opt.clear_grad()
        i += 1
        if progress is not None:
            progress.seek(0)
            progress.write(f"{i:12d}")
            progress.flush()


if __name__ == "__main__":
    main()
