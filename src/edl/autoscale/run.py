"""``edl sidecar``: wire the sidecar to the master over HTTP and to the cluster (Kubernetes)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading

from edl.api.cluster import Resources
from edl.api.master import ControlLink
from edl.errors import EdlError
from edl.autoscale.policy import get_policy
from edl.autoscale.sidecar import Sidecar, SidecarConfig
from edl.cluster.kube_api import KubeApi, load_api_client
from edl.cluster.kube_view import KubeClusterView
from edl.cluster.manifests import pod_from_env
from edl.masterlink import HttpMaster

log = logging.getLogger("edl.sidecar")


ABANDONMENT_CHECK_S = 2.0  # well within the master's linger (``edl.master.deadman.LINGER_S``)


def watch_abandonment(master: ControlLink, job: str, stop: threading.Event,
                      every_s: float = ABANDONMENT_CHECK_S) -> None:
    """Stop the sidecar (exit 0: its pod completes, it is not restarted) when the master ends the job
    because the launcher went silent (``edl.master.deadman``)."""
    while not stop.wait(every_s):
        try:
            st = master.status()
        except EdlError:
            continue  # refused or away: the decision loop reports that
        if st is not None and st.abandoned:
            log.warning("the launcher of job %s went silent and its master ends the job: sidecar exiting", job)
            stop.set()


def run_sidecar(job: str, master: str, token: str, namespace: str, policy: str, period_s: float, jitter_s: float,
                min_trainers: int, max_trainers: int, trainer: Resources, kubeconfig: str | None,
                node_selector: tuple[tuple[str, str], ...] = (),
                tolerations: tuple[tuple[str, str, str], ...] = ()) -> int:
    """Run the sidecar until SIGTERM; its settings come validated (``edl sidecar``: ``edl.api.spec``)."""
    chosen = get_policy(policy)
    kube = KubeApi(load_api_client(kubeconfig), namespace)
    # The pod and its uid: a later pod of the same name (the master recreated) is another sidecar; outside a
    # pod, the host and the process (two sidecars on one machine are two).
    owner = pod_from_env()
    holder = (f"{owner['name']}/{owner['uid']}" if owner
              else f"{os.environ.get('POD_NAME') or socket.gethostname()}/{os.getpid()}")
    # The demand Lease belongs to the sidecar's pod (the master's), so it goes with the job even when
    # nobody cleans up (the launcher killed): the garbage collector follows the owners.
    view = KubeClusterView(kube, job, holder, lease_duration_s=max(15, int(3 * period_s)), owner=owner).start()
    cfg = SidecarConfig(f"{namespace}/{job}", trainer, min_trainers, max_trainers, period_s, jitter_s,
                        node_selector, tolerations)
    link = HttpMaster(master, token, timeout_s=5.0, give_up_s=10.0)
    sidecar = Sidecar(cfg, view, link, chosen)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=watch_abandonment, args=(HttpMaster(master, token, timeout_s=2.0, give_up_s=0.0), job,
                                                        stop), name="edl-abandonment", daemon=True).start()
    log.info("sidecar for %s: policy %s every %.1f s, %d..%d trainers of %s", cfg.job, chosen.name, period_s,
             min_trainers, max_trainers, trainer)
    try:
        sidecar.run(stop.is_set, stop.wait)
    finally:
        view.stop()
    return 0
