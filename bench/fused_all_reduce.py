"""The gradient all-reduce alone: buckets summed while backward runs (edl now), buckets summed
after backward (edl before), one all-reduce per parameter (edl before that).

    python bench/fused_all_reduce.py [--rounds 6] [--steps 8]

Two processes form an edl Gloo group and step the same replica (edl.zoo.mlp, batch
256) taking turns between the paths, ``--steps`` steps each per round, with a
barrier before every step so that waiting for the slower peer is not counted. Times
the whole step (backward, all-reduce, optimizer step, zeroing) and the all-reduce
part left after backward, medians per path. The end-to-end comparison with Paddle is bench/throughput.py;
on this noisy machine its per-round noise (tens of percent) hides differences of a
few percent, which this pairing can resolve.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, rounds: int, steps: int, q) -> None:
    import numpy as np
    import paddle

    from edl.frameworks.paddle.group import PaddleGroup as Group
    from edl.frameworks.paddle.replica import PaddleReplica as Replica
    from edl.modeldef import load_model_def
    from edl.trainer.collective import Runner
    from edl.trainer.slots import own_slots

    r = Replica(load_model_def("edl.zoo.mlp"), 0, 0.01)
    group = Group("127.0.0.1", port, rank, 2, 7, timeout_s=60)
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((256, 256)).astype(np.float32)
    y = rng.integers(0, 10, 256).astype(np.int64)
    r.warm_up(x, y)
    barrier = paddle.zeros([1])

    runner = Runner()

    def overlapped() -> float:  # the trainer's path: each bucket sent from backward's hooks
        slots = own_slots(2, rank, None, 256, 1.0, False, False)
        r.begin_step(group, len(slots), runner.submit)
        r.backward(x, y)
        t = time.perf_counter()
        runner.wait(r.reduce_rest(group, slots, runner.submit), lambda: False)
        comm = time.perf_counter() - t
        r.end_step(512)
        return comm

    def fused() -> float:
        r.backward(x, y)
        t = time.perf_counter()
        r.all_reduce(group, own_slots(2, rank, None, 256, 1.0, False, False))
        comm = time.perf_counter() - t
        r.end_step(512)
        return comm

    def per_parameter() -> float:  # edl's all-reduce before buckets
        r.backward(x, y)
        t = time.perf_counter()
        for p in r.params:
            group.all_reduce_sum(p.grad)
        s = paddle.to_tensor(own_slots(2, rank, None, 256, 1.0, False, False))
        group.all_reduce_sum(s)
        s.numpy()
        comm = time.perf_counter() - t
        with paddle.no_grad():
            for p in r.params:
                p.grad.scale_(1.0 / 512)
        r.opt.step()
        r.opt.clear_grad()
        r._flats = []  # the next fused step packs afresh, as after a rebuild
        return comm

    times: dict[str, list[tuple[float, float]]] = {"overlapped": [], "buckets": [], "per parameter": []}
    for _ in range(rounds):
        for name, step in (("overlapped", overlapped), ("buckets", fused), ("per parameter", per_parameter)):
            for i in range(steps + 1):
                group.all_reduce_sum(barrier)
                t = time.perf_counter()
                comm = step()
                if i:  # the first step of a turn re-packs the gradients: not steady state
                    times[name].append((time.perf_counter() - t, comm))
    q.put((rank, times))
    group.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=8)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(k, port, a.rounds, a.steps, q)) for k in range(2)]
    for pr in procs:
        pr.start()
    results = dict(q.get(timeout=600) for _ in procs)
    for pr in procs:
        pr.join(30)
    out: dict = {"model": "edl.zoo.mlp (256-1024-1024-1024-10)", "batch_per_trainer": 256, "trainers": 2,
                 "rounds": a.rounds, "steps_per_turn": a.steps}
    for name in ("overlapped", "buckets", "per parameter"):
        both = results[0][name] + results[1][name]
        out[name] = {"step_ms_median": 1e3 * statistics.median(s for s, _ in both),
                     "all_reduce_ms_median": 1e3 * statistics.median(c for _, c in both)}
    o, b, pp = out["overlapped"], out["buckets"], out["per parameter"]
    out["step_time_overlapped_over_buckets"] = o["step_ms_median"] / b["step_ms_median"]
    out["step_time_buckets_over_per_parameter"] = b["step_ms_median"] / pp["step_ms_median"]
    out["all_reduce_buckets_over_per_parameter"] = b["all_reduce_ms_median"] / pp["all_reduce_ms_median"]
    path = write_result("fused_all_reduce", out)
    print(f"step: overlapped {o['step_ms_median']:.1f} ms (all-reduce left after backward "
          f"{o['all_reduce_ms_median']:.1f} ms; ratio to buckets {out['step_time_overlapped_over_buckets']:.3f}); "
          f"buckets {b['step_ms_median']:.1f} ms, per parameter {pp['step_ms_median']:.1f} ms "
          f"(ratio {out['step_time_buckets_over_per_parameter']:.3f}); all-reduce: buckets "
          f"{b['all_reduce_ms_median']:.1f} ms, per parameter {pp['all_reduce_ms_median']:.1f} ms "
          f"(ratio {out['all_reduce_buckets_over_per_parameter']:.3f}); written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
