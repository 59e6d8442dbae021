"""One job's autoscale sidecar on the plane of ``bench/control_scale.py``, in a process that holds what
its launcher holds before it starts the sidecar (``edl launch``'s modules and Kubernetes client): its
real informers (nodes, pods, demand Leases over the watch API), its Leases and the ``edl`` policy; its
master a double.

    python bench/_hollow_sidecar.py KUBECONFIG NAMESPACE JOB PERIOD_S OUT.json

Writes OUT.json.ready (JSON: the process's resident memory before the sidecar started) once it follows
the namespace's autoscaler Lease, then decides every PERIOD_S seconds until SIGTERM, and writes
OUT.json: each decision's start, duration and whether it planned the namespace (the sidecar holding the
Lease does), its resident memory and the pods it caches.
"""

from __future__ import annotations

import gc
import importlib
import json
import signal
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MasterDouble  # noqa: E402

from edl.api.cluster import Resources  # noqa: E402
from edl.autoscale.policy import get_policy  # noqa: E402
from edl.autoscale.sidecar import Sidecar, SidecarConfig, job_offset  # noqa: E402
from edl.cluster.kube_api import KubeApi, load_api_client  # noqa: E402
from edl.cluster.kube_view import KubeClusterView  # noqa: E402

TRAINER = Resources(1, 2)
MIN, MAX, START = 1, 20, 5


def main() -> int:
    kubeconfig, namespace, job, period, out = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), Path(sys.argv[5])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    importlib.import_module("edl.launcher.kube")  # the launcher's modules: its process holds them before its sidecar
    kube = KubeApi(load_api_client(kubeconfig), namespace)
    kube.get("leases", f"edl-{job}-demand")  # the launcher has called the API (its connections are open)
    gc.collect()
    before_mib = psutil.Process().memory_info().rss / 2 ** 20
    view = KubeClusterView(kube, job, f"{job}-sidecar", lease_duration_s=max(15, int(3 * period)))
    view.refresh(time.time())
    while not view.healthy() and not stop.wait(0.1):
        view.refresh(time.time())
    out.with_name(out.name + ".ready").write_text(json.dumps({"t": time.time(), "rss_before_mib": before_mib}))
    sidecar = Sidecar(SidecarConfig(f"{namespace}/{job}", TRAINER, MIN, MAX, period, period),
                      view, MasterDouble(f"{namespace}/{job}", START, MIN, MAX), get_policy("edl"))
    decisions: list[tuple[float, float, bool]] = []  # (start, seconds, whether it planned the namespace)
    stop.wait(job_offset(job, period))  # spread over the period, as the sidecars' jitter does
    while not stop.is_set():
        started = time.time()
        t = time.perf_counter()
        planned = sidecar.decisions
        sidecar.step()
        decisions.append((started, time.perf_counter() - t, sidecar.decisions > planned))
        stop.wait(max(0.0, period - (time.time() - started)))
    out.write_text(json.dumps({"job": job, "decisions": decisions, "rss_mib": psutil.Process().memory_info().rss / 2 ** 20,
                               "pods_cached": len(view.pod_cache.values())}))
    view.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
