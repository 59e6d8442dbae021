"""How long one scaling decision takes on a large snapshot: 5,000 nodes, 150,000 pods, 100 jobs.

    python bench/policy_speed.py

The snapshot carries the pods' sums as the sidecar's informer keeps them (``PodLedger``);
``scanned`` is the same decision adding up every pod. Target: ≤ 100 ms per decision.
Writes bench/results/policy_speed.json.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

from edl.api.cluster import JobDemand, Node, Pod, PodPhase, Resources, Snapshot  # noqa: E402
from edl.api.ledger import PodLedger  # noqa: E402
from edl.autoscale.policy import get_policy# noqa: E402


def big_snapshot(n_nodes: int = 5000, n_pods: int = 150_000, n_jobs: int = 100, seed: int = 0) -> Snapshot:
    rng = random.Random(seed)
    nodes = tuple(Node(f"node-{i:05d}", Resources(64, 256, 0)) for i in range(n_nodes))
    jobs = tuple(JobDemand(f"job-{i:03d}", 2, 200, rng.randint(2, 60), Resources(4, 8), rng.choice([0, 0, 10]))
                 for i in range(n_jobs))
    pods: list[Pod] = []
    for j in jobs:
        for k in range(j.current):
            pods.append(Pod(f"{j.name}-t{k}", j.trainer, PodPhase.RUNNING, j.priority,
                            nodes[rng.randrange(n_nodes)].name, j.name, "trainer"))
    while len(pods) < n_pods:
        i = len(pods)
        phase = PodPhase.PENDING if i % 50 == 0 else PodPhase.RUNNING
        pods.append(Pod(f"svc-{i}", Resources(0.5, 1), phase, 1000,
                        None if phase is PodPhase.PENDING else nodes[rng.randrange(n_nodes)].name))
    ledger = PodLedger()
    for p in pods:
        ledger.put(p.name, p)
    return Snapshot(nodes, tuple(pods), jobs, totals=ledger.totals())


def main() -> int:
    snap = big_snapshot()
    result = {"nodes": len(snap.nodes), "pods": len(snap.pods), "jobs": len(snap.jobs)}
    console = Console()
    scanned = dataclasses.replace(snap, totals=None)
    for name, policy_name, s in (("edl2017", "edl2017", snap), ("edl_scanned", "edl", scanned), ("edl", "edl", snap)):
        policy = get_policy(policy_name)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            policy.plan(s)  # what the sidecar runs: the sizes and where the trainers go
            times.append(time.perf_counter() - t)
        result[f"{name}_median_s"] = statistics.median(times)
        console.print(f"{name}: median {1000 * statistics.median(times):.0f} ms per decision (target ≤ 100 ms)")
    console.print(f"written to {write_result('policy_speed', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
