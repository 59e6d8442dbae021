"""What one checkpoint costs the training loop, measured in-process, for either framework.

    python bench/checkpoint_cost.py [--framework paddle|torch] [--model mlp|transformer]

The interleaved A/B in throughput.py cannot resolve a cost this small on this noisy machine, so
this measures its parts on the replica the trainer uses (``edl.frameworks``): the snapshot that
blocks the training thread (copies of the parameters and the optimizer's state), the writer
thread's work, and the step time while the writer runs. ``--model transformer`` is the zoo's
23 M-parameter transformer (batch 16 of 64 tokens), where a snapshot is no longer negligible.
Writes bench/results/checkpoint_cost[_torch][_transformer].json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

from edl.frameworks import load  # noqa: E402
from edl.modeldef import load_model_def  # noqa: E402
from edl.storage.checkpoint import AsyncCheckpointWriter, CheckpointStore, WriteJob, encode_arrays  # noqa: E402
from edl.storage.store import open_store  # noqa: E402
from edl.trainer.slots import own_slots  # noqa: E402

MODELS = {("paddle", "mlp"): "edl.zoo.mlp", ("torch", "mlp"): "edl.zoo.torch.mlp",
          ("paddle", "transformer"): "edl.zoo.transformer", ("torch", "transformer"): "edl.zoo.torch.transformer"}


def batch(model: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if model == "transformer":
        return rng.integers(0, 8192, (16, 64)).astype(np.int64), rng.integers(0, 10, 16).astype(np.int64)
    return rng.standard_normal((256, 256)).astype(np.float32), rng.integers(0, 10, 256).astype(np.int64)


def main() -> int:
    p = argparse.ArgumentParser(description="the cost of one checkpoint to the training loop")
    p.add_argument("--framework", choices=("paddle", "torch"), default="paddle", help="default paddle")
    p.add_argument("--model", choices=("mlp", "transformer"), default="mlp",
                   help="the zoo's mlp (batch 256) or its 23 M-parameter transformer (batch 16); default mlp")
    p.add_argument("--rounds", type=int, default=5, help="checkpoints taken (default 5)")
    a = p.parse_args()
    fw = load(a.framework)
    model_def = MODELS[(a.framework, a.model)]
    replica = fw.replica(load_model_def(model_def), 0, 1e-3, None)
    group = fw.group("127.0.0.1", 0, 0, 1, 0, "gloo")  # one process: the steps' arithmetic, no peers
    x, y = batch(a.model, np.random.default_rng(0))
    slots = own_slots(1, 0, None, len(y), 0.0, False, False)

    def step() -> float:
        t = time.perf_counter()
        replica.backward(x, y)
        replica.all_reduce(group, slots)
        replica.end_step(len(y))
        return time.perf_counter() - t

    for _ in range(3):
        step()
    snaps, writes, during, plain = [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        writer = AsyncCheckpointWriter(CheckpointStore(open_store(d), keep=2))
        for i in range(a.rounds):
            plain += [step() for _ in range(5)]
            t = time.perf_counter()
            params, opt_arrays, _ = replica.snapshot()
            snaps.append(time.perf_counter() - t)
            done: list[float] = []
            writer.submit(WriteJob(i, lambda: {"model.npz": encode_arrays(params),
                                               "optimizer.npz": encode_arrays(opt_arrays)},
                                   {}, lambda c, s: done.append(s) or True))  # taken: prune as rank 0 does
            while not done:
                during.append(step())
            writes.append(done[0])
    step_s = statistics.median(plain)
    slowdown = sum(max(0.0, s - step_s) for s in during) / len(snaps)
    per_ckpt = statistics.median(snaps) + slowdown
    state_mb = (sum(v.nbytes for v in params.values()) + sum(v.nbytes for v in opt_arrays.values())) / 2**20
    result = {
        "framework": a.framework, "model": model_def, "state_mb": state_mb,
        "command": "python bench/checkpoint_cost.py " + " ".join(sys.argv[1:]),
        "step_s": step_s, "snapshot_s": statistics.median(snaps), "write_s": statistics.median(writes),
        "snapshot_over_step": statistics.median(snaps) / step_s,
        "steps_during_write": len(during) / len(snaps), "extra_step_time_during_write_s": slowdown,
        "cost_per_checkpoint_s": per_ckpt, "cost_at_30s_interval": per_ckpt / 30.0,
    }
    name = "checkpoint_cost" + ("" if a.framework == "paddle" else "_torch") + \
        ("" if a.model == "mlp" else "_transformer")
    path = write_result(name, result)
    Console().print(
        f"{model_def} ({state_mb:.0f} MB of state): step {1000 * step_s:.0f} ms; per checkpoint: snapshot "
        f"{1000 * result['snapshot_s']:.0f} ms on the training thread ({100 * result['snapshot_over_step']:.1f} % of a "
        f"step; target ≤ 5 %), write {1000 * result['write_s']:.0f} ms on the writer thread, steps during the write "
        f"slower by {1000 * slowdown:.0f} ms in all -> {100 * result['cost_at_30s_interval']:.2f} % of training time "
        f"at one checkpoint every 30 s (target ≤ 3 %); written to {path}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
