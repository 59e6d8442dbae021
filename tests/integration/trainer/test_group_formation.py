"""Real Gloo groups of three processes: the group forms with Nagle off on its store connection, and a
second group forms on a side thread while the first one goes on all-reducing."""

from __future__ import annotations

import json

import pytest

from tests.integration.trainer.ranks import free_port, run_ranks

pytestmark = pytest.mark.timeout(180)

WORKER = r"""
import json, os, socket, sys, threading
import paddle
from edl.frameworks.paddle.group import PaddleGroup as Group
from edl.frameworks.rendezvous import store_sockets


def no_delay_on(fd):
    s = socket.socket(fileno=os.dup(fd))  # a duplicate: closing it leaves the store's socket open
    try:
        return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        s.close()


rank, world, port, port2 = (int(a) for a in sys.argv[1:5])
group = Group("127.0.0.1", port, rank, world, 11)
nodelay = [no_delay_on(fd) for fd in store_sockets("127.0.0.1", port)]
x = paddle.to_tensor([float(rank + 1)])
group.all_reduce_sum(x)
sums = [float(x.numpy()[0])]

# The next group forms on a thread while this one keeps all-reducing.
formed = {}
side = threading.Thread(target=lambda: formed.setdefault("group", Group("127.0.0.1", port2, rank, world, 12)))
side.start()
steps = 0
while True:
    t = paddle.to_tensor([1.0])
    group.all_reduce_sum(t)
    sums.append(float(t.numpy()[0]))
    steps += 1
    # Every rank takes the same number of steps: whether all have formed is agreed on in the collective.
    done = paddle.to_tensor([0.0 if side.is_alive() else 1.0])
    group.all_reduce_sum(done)
    if float(done.numpy()[0]) == world and steps >= 3:
        break
side.join(60)
y = paddle.to_tensor([10.0 * (rank + 1)])
formed["group"].all_reduce_sum(y)
print(json.dumps({"nodelay": nodelay, "sums": sums, "steps": steps, "next_sum": float(y.numpy()[0])}))
"""


def test_a_group_forms_with_no_delay_and_the_next_one_forms_beside_it():
    world, port, port2 = 3, free_port(), free_port()
    outs = run_ranks(WORKER, world, lambda r: [str(r), str(world), str(port), str(port2)], timeout=150)
    results = [json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{"))) for out in outs]
    for r in results:
        assert r["nodelay"] and all(r["nodelay"])  # found the store connection, and Nagle is off on it
        assert r["sums"][0] == 1 + 2 + 3
        assert all(s == world for s in r["sums"][1:])  # the old group kept stepping, every step complete
        assert r["next_sum"] == 10 + 20 + 30  # the group formed on the side works
    assert len({r["steps"] for r in results}) == 1 and results[0]["steps"] >= 3
