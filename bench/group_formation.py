"""How long a Gloo group takes to form: Paddle's own store and group against edl's ``Group``.

    python bench/group_formation.py [--sizes 2 3 4] [--rounds 3]

Per group size n and round, n processes (Paddle imported first) start together and each forms:
1. Paddle's way: ``core.TCPStore(host, port, rank == 0, n)`` then ``ProcessGroupGloo.create``,
   which is what ``paddle.distributed`` does;
2. edl's ``Group`` (``edl.frameworks.paddle.group``): the same two calls, but the store is made without
   its barrier and its client connection gets TCP_NODELAY before the first request.
Each then all-reduces one tensor (checked). Reported per size: the slowest rank's formation time
(store and group) of each way, the median over the rounds, and their ratio.

Why the two differ: Paddle's store client writes every request in pieces (command, key length, key,
value) on a socket that keeps Nagle's algorithm on, so each piece after the first waits for the
server's delayed ACK (40 ms on Linux). Gloo's rendezvous makes a few such requests per peer.
Prints a table and writes bench/results/group_formation.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

WORKER = r"""
import json, os, sys, time
rank, world, port_paddle, port_edl, start_at = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
import paddle
from paddle.base import core
from edl.frameworks.paddle.group import PaddleGroup as Group
from edl.frameworks.rendezvous import wait_listening as _wait_listening
os.environ["PADDLE_TRAINER_ID"], os.environ["PADDLE_TRAINERS_NUM"] = str(rank), str(world)
while time.time() < start_at:
    time.sleep(0.001)
out = {}
t0 = time.perf_counter()
if rank:
    _wait_listening("127.0.0.1", port_paddle, time.monotonic() + 30)  # Paddle's client would retry every 3 s
store = core.TCPStore("127.0.0.1", port_paddle, rank == 0, world, 30)
pg = core.ProcessGroupGloo.create(store, rank, world, 1000 + world)
out["paddle_s"] = time.perf_counter() - t0
x = paddle.to_tensor([float(rank + 1)])
pg.all_reduce(x, core.ReduceOp.SUM, True)
assert float(x.numpy()[0]) == world * (world + 1) / 2
t0 = time.perf_counter()
g = Group("127.0.0.1", port_edl, rank, world, 2000 + world, timeout_s=30)
out["edl_s"] = time.perf_counter() - t0
y = paddle.to_tensor([float(rank + 1)])
g.all_reduce_sum(y)
assert float(y.numpy()[0]) == world * (world + 1) / 2
print(json.dumps(out))
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_round(n: int) -> dict:
    start_at = time.time() + 15 + 2 * n  # every process has imported Paddle by then, on a loaded machine too
    args = [str(_port()), str(_port()), str(start_at)]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), str(n), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(n)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=180)
            if p.returncode != 0:
                raise RuntimeError(f"a worker failed: {err[-1500:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"paddle_s": max(o["paddle_s"] for o in outs), "edl_s": max(o["edl_s"] for o in outs)}


def main() -> int:
    p = argparse.ArgumentParser(description="Gloo group formation: Paddle's store and group against edl's Group")
    p.add_argument("--sizes", type=int, nargs="+", default=[2, 3, 4], help="group sizes (default 2 3 4)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per size (default 3)")
    a = p.parse_args()
    console = Console(width=120)
    rows = []
    for n in a.sizes:
        rounds = [one_round(n) for _ in range(a.rounds)]
        row = {"group_size": n, "rounds": rounds,
               "paddle_s": statistics.median_high([r["paddle_s"] for r in rounds]),
               "edl_s": statistics.median_high([r["edl_s"] for r in rounds])}
        row["edl_over_paddle"] = row["edl_s"] / row["paddle_s"]
        rows.append(row)
        console.print(f"  group of {n}: Paddle {row['paddle_s']:.3f} s, edl {row['edl_s']:.3f} s")
    result = {"command": "python bench/group_formation.py " + " ".join(sys.argv[1:]), "sizes": rows}
    path = write_result("group_formation", result)
    t = Table(title=f"Gloo group formation, slowest rank, median of {a.rounds} (seconds)")
    for col in ("n", "Paddle (TCPStore + ProcessGroupGloo.create)", "edl Group", "edl / Paddle"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["group_size"]), f"{r['paddle_s']:.3f}", f"{r['edl_s']:.3f}", f"{r['edl_over_paddle']:.2f}")
    console.print(t)
    console.print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
