"""``edl sidecar``: wire the sidecar to the master over HTTP and to the cluster (Kubernetes)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading

from edl.api.cluster import Resources
from edl.autoscale.policy import get_policy
from edl.autoscale.sidecar import Sidecar, SidecarConfig
from edl.cluster.kube_api import KubeApi, load_api_client
from edl.cluster.kube_view import KubeClusterView
from edl.cluster.manifests import pod_from_env
from edl.master.client import HttpMaster

log = logging.getLogger("edl.sidecar")


def run_sidecar(job: str, master: str, token: str, namespace: str, policy: str, period_s: float, jitter_s: float,
                min_trainers: int, max_trainers: int, trainer: Resources, kubeconfig: str | None) -> int:
    """Run the sidecar until SIGTERM; its settings come validated (``edl sidecar``: ``edl.api.spec``)."""
    chosen = get_policy(policy)
    kube = KubeApi(load_api_client(kubeconfig), namespace)
    holder = os.environ.get("POD_NAME") or socket.gethostname()
    # The demand Lease belongs to the sidecar's pod (the master's), so it goes with the job even when
    # nobody cleans up (the launcher killed): the garbage collector follows the owners.
    view = KubeClusterView(kube, job, holder, lease_duration_s=max(15, int(3 * period_s)),
                           owner=pod_from_env()).start()
    cfg = SidecarConfig(f"{namespace}/{job}", trainer, min_trainers, max_trainers, period_s, jitter_s)
    sidecar = Sidecar(cfg, view, HttpMaster(master, token, timeout_s=5.0, give_up_s=10.0), chosen)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("sidecar for %s: policy %s every %.1f s, %d..%d trainers of %s", cfg.job, chosen.name, period_s,
             min_trainers, max_trainers, trainer)
    try:
        sidecar.run(stop.is_set, stop.wait)
    finally:
        view.stop()
    return 0
