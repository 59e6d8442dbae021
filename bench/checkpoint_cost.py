"""What one checkpoint costs the training loop, measured in-process on edl.zoo.mlp.

    python bench/checkpoint_cost.py

The interleaved A/B in throughput.py cannot resolve a cost this small on this
noisy machine, so this measures its parts: the snapshot that blocks the training
thread, the writer thread's work, and the step time while the writer runs.
Writes bench/results/checkpoint_cost.json.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import paddle
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

from edl.storage.checkpoint import AsyncCheckpointWriter, CheckpointStore, WriteJob, encode_arrays  # noqa: E402
from edl.storage.store import open_store  # noqa: E402
from edl.trainer import state as mstate  # noqa: E402
from edl.zoo import mlp  # noqa: E402


def main() -> int:
    paddle.seed(0)
    model = mlp.model()
    opt = mlp.optimizer(model.parameters(), 0.01)
    x, y = paddle.randn([256, 256]), paddle.randint(0, 10, [256])

    def step() -> float:
        t = time.perf_counter()
        loss = mlp.loss(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
        return time.perf_counter() - t

    for _ in range(5):
        step()
    snaps, writes, during, plain = [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        writer = AsyncCheckpointWriter(CheckpointStore(open_store(d), keep=2))
        for i in range(5):
            plain += [step() for _ in range(5)]
            t = time.perf_counter()
            params, opt_arrays, _ = mstate.snapshot(model, opt)
            snaps.append(time.perf_counter() - t)
            done: list[float] = []
            writer.submit(WriteJob(i, lambda: {"model.npz": encode_arrays(params),
                                               "optimizer.npz": encode_arrays(opt_arrays)},
                                   {}, lambda c, s: done.append(s)))
            while not done:
                during.append(step())
            writes.append(done[0])
    step_s = statistics.median(plain)
    slowdown = sum(max(0.0, s - step_s) for s in during) / len(snaps)
    per_ckpt = statistics.median(snaps) + slowdown
    result = {
        "step_s": step_s, "snapshot_s": statistics.median(snaps), "write_s": statistics.median(writes),
        "steps_during_write": len(during) / len(snaps), "extra_step_time_during_write_s": slowdown,
        "cost_per_checkpoint_s": per_ckpt, "cost_at_30s_interval": per_ckpt / 30.0,
    }
    path = write_result("checkpoint_cost", result)
    Console().print(
        f"step {1000 * step_s:.0f} ms; per checkpoint: snapshot {1000 * result['snapshot_s']:.0f} ms on the training "
        f"thread, write {1000 * result['write_s']:.0f} ms on the writer thread, steps during the write slower by "
        f"{1000 * slowdown:.0f} ms in all -> {100 * result['cost_at_30s_interval']:.2f} % of training time at one "
        f"checkpoint every 30 s (target ≤ 3 %); written to {path}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
