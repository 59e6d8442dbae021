"""The sidecar's ``ClusterView`` on Kubernetes: informer caches of nodes, pods and demand Leases."""

from __future__ import annotations

from edl.api.cluster import JobDemand, Node, Pod, PodTotals, SizeReason
from edl.api.ledger import PodLedger
from edl.cluster.demand_lease import demand_from_lease, demand_lease
from edl.cluster.informer import Informer
from edl.cluster.kube_api import KubeApi
from edl.cluster.kube_objects import decode_node, decode_pod
from edl.cluster.manifests import labels, names, owner_references
from edl.errors import KubeConflictError, KubeNotFoundError, TemporaryError


class KubeClusterView:
    """The sidecar's ``ClusterView`` on Kubernetes: informer caches of nodes, pods and demand Leases.

    No full list per period: the caches follow watch events. Demands are Leases in
    the sidecar's namespace labelled ``edl.dev/role=demand`` (the namespaced Role allows
    only that); jobs in other namespaces still count, as the pods they run.
    """

    LEASE_SELECTOR = "edl.dev/role=demand"

    def __init__(self, kube: KubeApi, job: str, holder: str, lease_duration_s: int,
                 watch_timeout_s: int = 60, owner: dict | None = None) -> None:
        self.kube = kube
        self.job = job
        self.holder = holder
        self.owner = owner  # {"name", "uid"} of the pod the sidecar runs in: the Lease goes with it
        self.lease_name = names(job)["lease"]
        self.lease_labels = labels(job, "demand")
        self.lease_duration_s = lease_duration_s
        self.node_cache = Informer("nodes", kube.list_watch("nodes"), decode_node, watch_timeout_s=watch_timeout_s)
        # The pods summed as they change: a decision reads the sums, not every pod (``Snapshot.totals``).
        self.ledger = PodLedger()
        self._totals: PodTotals | None = None
        self.pod_cache: Informer[Pod] = Informer("pods", kube.list_watch("pods", all_namespaces=True), decode_pod,
                                  watch_timeout_s=watch_timeout_s, index=self.ledger)
        self.lease_cache = Informer("leases", kube.list_watch("leases"), lambda o: o, selector=self.LEASE_SELECTOR,
                                    watch_timeout_s=watch_timeout_s)
        self._caches = (self.node_cache, self.pod_cache, self.lease_cache)

    def list_once(self) -> "KubeClusterView":
        """Fill each cache with one list and follow no watch: a one-off reader (the launcher, placing
        its master by the plan before it creates it)."""
        for c in self._caches:
            c.relist()
        return self

    def start(self) -> "KubeClusterView":
        for c in self._caches:
            c.start()
        return self

    def stop(self) -> None:
        for c in self._caches:
            c.stop()

    def healthy(self) -> bool:
        return all(c.healthy() for c in self._caches)

    def nodes(self) -> list[Node]:
        return sorted(self.node_cache.values(), key=lambda n: n.name)

    def pods(self) -> list[Pod]:
        pods, self._totals = self.pod_cache.values_and(self.ledger.totals)
        return pods

    def totals(self) -> PodTotals | None:
        """The sums of the pods the last ``pods()`` returned."""
        return self._totals

    def peer_demands(self, now: float) -> list[JobDemand]:
        out = []
        for obj in self.lease_cache.values():
            d = demand_from_lease(obj, now)
            if d is not None:
                out.append(d)
        return out

    def publish(self, demand: JobDemand, now: float, reason: SizeReason | None = None) -> None:
        lease = demand_lease(demand, self.lease_name, self.kube.namespace, self.holder, now, self.lease_duration_s,
                             self.lease_labels, reason)
        if self.owner is not None:
            lease["metadata"]["ownerReferences"] = owner_references(self.owner, controller=False)
        cached = self.lease_cache.get(f"{self.kube.namespace}/{self.lease_name}")
        version = None if cached is None else cached["metadata"]["resourceVersion"]
        for _ in range(3):  # optimistic concurrency: re-read on a conflict
            if version is None:
                current, created = self.kube.create(lease)
                if created:
                    return
                version = current["metadata"]["resourceVersion"]
            lease["metadata"]["resourceVersion"] = version
            try:
                self.kube.replace(lease)
                return
            except (KubeConflictError, KubeNotFoundError):  # changed or deleted since read: read again
                fresh = self.kube.get("leases", self.lease_name)
                version = None if fresh is None else fresh["metadata"]["resourceVersion"]
        raise TemporaryError(f"lease {self.lease_name}: kept conflicting")
