"""The autoscale sidecar on Kubernetes: a thread of the job's launcher (``edl launch``), wired to the
master over HTTP (``edl.masterlink.FollowedMaster``: the master the launcher follows now) and to the
cluster through the launcher's own Kubernetes client.

Why a thread of the launcher and not a container of its own: the launcher already lives as long as the
job, reaches its master with the job's token and holds a Kubernetes client, whose package alone adds
some 45–65 MiB to every Python process that imports it. As a thread, a sidecar that follows the
namespace's deciding one costs its launcher a thread and one read of a Lease a period; only the deciding
one holds the caches of the cluster (``edl.cluster.kube_view``), so the sidecars' memory does not grow
with the jobs. The local launcher runs its sidecar the same way (``edl.launcher.local``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass

from edl.api.cluster import Resources
from edl.api.spec import JobSpec, K8sOptions, selector_pairs, toleration_triples
from edl.autoscale.policy import get_policy
from edl.autoscale.sidecar import Sidecar, SidecarConfig
from edl.cluster.kube_api import KubeApi
from edl.cluster.kube_objects import GIB, quantity
from edl.cluster.kube_view import KubeClusterView
from edl.masterlink import FollowedMaster

log = logging.getLogger("edl.sidecar")
STOP_WAIT_S = 2.0  # for a decision in flight to end (it can do no harm after ``stop``: this only tidies)


def sidecar_config(spec: JobSpec, opts: K8sOptions) -> SidecarConfig:
    """The job's sidecar settings, from the options its trainers are created with (validated)."""
    trainer = Resources(quantity(opts.trainer_cpu), quantity(opts.trainer_memory) / GIB, float(opts.trainer_gpu))
    return SidecarConfig(f"{opts.namespace}/{spec.job}", trainer, spec.min_trainers, spec.max_trainers,
                         opts.sidecar_period_s, opts.sidecar_jitter_s,
                         # The plan counts only the nodes the trainers may go to.
                         selector_pairs(opts.trainer_node_selector), toleration_triples(opts.trainer_tolerations))


def holder_identity(owner: dict | None) -> str:
    """Who writes the sidecar's Leases: the launcher's pod and its uid (a retried step is another pod);
    outside a pod, the host and the process."""
    if owner is not None:
        return f"{owner['name']}/{owner['uid']}"
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}/{os.getpid()}"


@dataclass
class RunningSidecar:
    sidecar: Sidecar
    view: KubeClusterView
    master: FollowedMaster
    thread: threading.Thread
    stop_event: threading.Event

    def stop(self) -> None:
        """Stop deciding, for good: a sidecar that decides for the namespace hands it on at once (its Lease
        deleted). Once this returns the sidecar writes no Lease and sets no size, even where a decision still
        in flight outlives the wait for it: the launcher may remove the job's Leases. Idempotent."""
        self.stop_event.set()
        self.master.close()
        self.view.stop()  # waits for a Lease being written, then refuses the rest
        self.thread.join(STOP_WAIT_S)


def start_sidecar(kube: KubeApi, job: str, cfg: SidecarConfig, master: FollowedMaster, policy: str,
                  owner: dict | None) -> RunningSidecar:
    """Start the job's sidecar in a thread: ``kube`` the launcher's client in the job's namespace, ``job``
    the job's name there (``cfg.job`` qualifies it), ``owner`` the launcher's pod, which owns the Leases the
    sidecar writes (the garbage collector removes them with it, even when nothing cleans up)."""
    chosen = get_policy(policy)
    # A Lease lapses after three periods without renewal (15 s at least): a sidecar that stopped no longer counts.
    view = KubeClusterView(kube, job, holder_identity(owner), lease_duration_s=max(15, int(3 * cfg.period_s)),
                           owner=owner)
    sidecar = Sidecar(cfg, view, master, chosen)
    stop = threading.Event()
    thread = threading.Thread(target=sidecar.run, args=(stop.is_set, stop.wait), name="edl-sidecar", daemon=True)
    thread.start()
    log.info("sidecar for %s: policy %s every %.1f s, %d..%d trainers of %s", cfg.job, chosen.name, cfg.period_s,
             cfg.min, cfg.max, cfg.trainer)
    return RunningSidecar(sidecar, view, master, thread, stop)
