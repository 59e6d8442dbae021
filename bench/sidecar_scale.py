"""The sidecar at scale: its cache of a 5,000-node, 150,000-pod cluster, and one decision over it.

    python bench/sidecar_scale.py

Pods and nodes are built as the API server sends them (JSON objects with the usual
metadata, spec and status), decoded by the informer's own decoders into its cache
and its pod ledger (the sums a decision reads, kept as pods change), and the
sidecar's decision step runs over that cache: snapshot, all 100 jobs' demands, the
``edl`` policy. Targets: decision ≤ 100 ms, cache ≤ 1 GiB.
Writes bench/results/sidecar_scale.json.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MasterDouble, write_result  # noqa: E402

from edl.api.cluster import JobDemand, Resources  # noqa: E402
from edl.api.ledger import PodLedger  # noqa: E402
from edl.autoscale.policy import get_policy  # noqa: E402
from edl.autoscale.sidecar import Sidecar, SidecarConfig  # noqa: E402
from edl.cluster.kube_objects import decode_node, decode_pod  # noqa: E402

N_NODES, N_PODS, N_JOBS = 5000, 150_000, 100


def node_json(i: int) -> dict:
    return {"metadata": {"name": f"node-{i:05d}", "labels": {"kubernetes.io/hostname": f"node-{i:05d}"},
                         "resourceVersion": str(i)},
            "spec": {"podCIDR": f"10.{i // 256}.{i % 256}.0/24"},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod_json(i: int, rng: random.Random, job: str | None) -> dict:
    pending = i % 50 == 0 and job is None
    return {"metadata": {"name": f"pod-{i}", "namespace": "ml" if job else f"team-{i % 40}",
                         "uid": f"{i:08d}-0000-4000-8000-000000000000", "resourceVersion": str(10_000 + i),
                         "labels": ({"edl.dev/job": job, "edl.dev/role": "trainer"} if job
                                    else {"app": f"svc-{i % 300}", "pod-template-hash": "abc123"}),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                              "uid": "u", "controller": True}]},
            "spec": {"nodeName": None if pending else f"node-{rng.randrange(N_NODES):05d}",
                     "priority": 0 if job else 1000,
                     "containers": [{"name": "main", "image": "registry.example/app:1.2.3",
                                     "resources": {"requests": {"cpu": "4" if job else "500m",
                                                                "memory": "8Gi" if job else "1Gi"}}}]},
            "status": {"phase": "Pending" if pending else "Running", "podIP": f"10.0.{i // 256 % 256}.{i % 256}"}}


class CacheView:
    """``KubeClusterView`` over caches filled in place of its informers."""

    def __init__(self, nodes, pods, ledger: PodLedger, demands) -> None:
        self._nodes, self._pods, self.ledger, self.demands = nodes, pods, ledger, demands
        self._totals = None

    def healthy(self):
        return True

    def nodes(self):
        return sorted(self._nodes.values(), key=lambda n: n.name)

    def pods(self):
        self._totals = self.ledger.totals()
        return list(self._pods.values())

    def totals(self):
        return self._totals

    def peer_demands(self, now):
        return self.demands

    def publish(self, demand, now, reason=None):
        pass

    def refresh(self, now):
        pass

    def lead(self, now):
        return True  # the one sidecar of the namespace that decides: it plans every job

    def publish_plan(self, lines, now):
        return True

    def plan_line(self, job, now):
        return None


def main() -> int:
    console = Console()
    rng = random.Random(0)
    jobs = [f"job-{k:03d}" for k in range(N_JOBS)]
    sizes = {j: rng.randint(2, 60) for j in jobs}
    gc.collect()
    tracemalloc.start()
    t = time.perf_counter()
    node_cache = {}
    for i in range(N_NODES):
        n = decode_node(node_json(i))
        node_cache[f"/{n.name}"] = n
    pod_cache = {}
    ledger = PodLedger()  # as the informer keeps it, pod by pod
    i = 0
    for j in jobs:
        for _ in range(sizes[j]):
            p = decode_pod(pod_json(i, rng, j))
            pod_cache[p.name] = p
            ledger.put(p.name, p)
            i += 1
    while i < N_PODS:
        p = decode_pod(pod_json(i, rng, None))
        pod_cache[p.name] = p
        ledger.put(p.name, p)
        i += 1
    decode_s = time.perf_counter() - t
    cache_bytes, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    demands = [JobDemand(f"ml/{j}", 2, 200, sizes[j], Resources(4, 8), 0) for j in jobs]
    view = CacheView(node_cache, pod_cache, ledger, demands)
    sidecar = Sidecar(SidecarConfig("ml/job-000", Resources(4, 8), 2, 200), view, MasterDouble("ml/job-000", sizes["job-000"], 2, 200),
                      get_policy("edl"), clock=lambda: 1000.0)
    # The first decision after the caches are filled also pays Python's first full garbage collection
    # of them (a one-off of the sidecar's start): it is reported apart from the ones that follow.
    t = time.perf_counter()
    sidecar.step()
    first = time.perf_counter() - t
    times = []
    for _ in range(5):
        t = time.perf_counter()
        sidecar.step()
        times.append(time.perf_counter() - t)
    result = {"nodes": N_NODES, "pods": N_PODS, "jobs": N_JOBS, "cache_mib": cache_bytes / 2 ** 20,
              "decode_s": decode_s, "decision_median_s": statistics.median(times),
              "decision_max_s": max(times), "first_decision_s": first}
    console.print(f"cache of {N_NODES} nodes and {N_PODS} pods: {result['cache_mib']:.0f} MiB (target ≤ 1024 MiB), "
                  f"decoded in {decode_s:.1f} s")
    console.print(f"sidecar decision (snapshot + {N_JOBS} demands + edl policy): median "
                  f"{1000 * result['decision_median_s']:.0f} ms, max {1000 * result['decision_max_s']:.0f} ms "
                  f"(target ≤ 100 ms); the first {1000 * first:.0f} ms")
    console.print(f"written to {write_result('sidecar_scale', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
