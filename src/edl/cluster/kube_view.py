"""The sidecar's ``ClusterView`` on Kubernetes: the namespace's deciding sidecar, elected by a Lease, and
its informer caches of nodes, pods and demand Leases."""

from __future__ import annotations

import logging
import threading

from edl.api.cluster import JobDemand, Node, PlanLine, Pod, PodTotals, SizeReason
from edl.api.ledger import PodLedger
from edl.cluster import autoscaler_lease
from edl.cluster.demand_lease import demand_from_lease, demand_lease
from edl.cluster.informer import Informer
from edl.cluster.kube_api import KubeApi
from edl.cluster.kube_objects import decode_node, decode_pod
from edl.cluster.manifests import APP, labels, names, owner_references
from edl.errors import EdlError, KubeConflictError, KubeNotFoundError, TemporaryError

log = logging.getLogger("edl.sidecar")


class KubeClusterView:
    """The sidecar's ``ClusterView`` on Kubernetes: informer caches of nodes, pods and demand Leases,
    held by the one sidecar that decides for the namespace.

    The sidecars of a namespace's jobs elect one of them through the namespace's autoscaler Lease
    (``edl.cluster.autoscaler_lease``): it follows nodes, pods and the jobs' demand Leases, plans every
    job and writes each job's line into the Lease as it renews it. The others read that one Lease once a
    period (``refresh``, just before they decide) and decode their own line only: a follower holds no
    cache, no watch and no thread, so the apiserver serves one set of caches per namespace, not one
    per job, and a follower costs its launcher next to nothing. When the holder stops renewing (its
    job ended, its pod is gone), the next sidecar to find the Lease lapsed takes it and lists the
    cluster. No full list per period: the leader's caches follow watch events. Demands are Leases in
    the namespace labelled ``edl.dev/role=demand`` (the namespaced Role allows only that); jobs in
    other namespaces still count, as the pods they run.
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
        self.watch_timeout_s = watch_timeout_s
        self._autoscaler: dict | None = None  # the namespace's autoscaler Lease, as ``refresh`` last read it
        self._read: bool | None = None  # whether that read succeeded (``None``: not read yet)
        # Held across each write of a Lease and by ``stop``: once stopped, a decision still in flight (its
        # thread outlived the launcher's wait) writes nothing, and no Lease comes back after the cleanup.
        self._writing = threading.Lock()
        self._stopped = False
        self.leading = False
        self._leader_labels = {"app.kubernetes.io/name": APP, "edl.dev/role": autoscaler_lease.ROLE}
        self._leader_version: str | None = None  # of the autoscaler Lease as this sidecar last wrote it
        self._renewed_at = 0.0  # when it last wrote it
        self._lines: dict[str, PlanLine] | None = None  # the plan it last wrote into it
        self._demand_version: str | None = None  # of its demand Lease, likewise
        self._totals: PodTotals | None = None
        self._build_caches()

    def _build_caches(self) -> None:
        """Fresh caches of nodes, pods and demands (an Informer runs once: a new leader builds new ones)."""
        w = self.watch_timeout_s
        self.node_cache: Informer[Node] = Informer("nodes", self.kube.list_watch("nodes"), decode_node,
                                                   watch_timeout_s=w)
        # The pods summed as they change: a decision reads the sums, not every pod (``Snapshot.totals``).
        self.ledger = PodLedger()
        self.pod_cache: Informer[Pod] = Informer("pods", self.kube.list_watch("pods", all_namespaces=True), decode_pod,
                                                 watch_timeout_s=w, index=self.ledger)
        self.lease_cache: Informer[dict] = Informer("leases", self.kube.list_watch("leases"), lambda o: o,
                                                    selector=self.LEASE_SELECTOR, watch_timeout_s=w)
        self._caches = (self.node_cache, self.pod_cache, self.lease_cache)
        self._caches_started = False

    def list_once(self) -> "KubeClusterView":
        """Fill each cache with one list and follow no watch: a one-off reader (the launcher, placing
        its master by the plan before it creates it)."""
        for c in self._caches:
            c.relist()
        return self

    def refresh(self, now: float) -> None:
        """Read the namespace's autoscaler Lease (who decides, and every job's line): once a period, before
        ``healthy`` and ``lead``. A read that fails makes the view unhealthy until one succeeds."""
        try:
            self._autoscaler = self.kube.get("leases", autoscaler_lease.LEASE_NAME)
        except EdlError as e:
            if self._read is not False:
                log.warning("cannot read the autoscaler Lease of namespace %s: %s", self.kube.namespace,
                            str(e).splitlines()[0] if str(e) else type(e).__name__)
            self._read = False
            return
        self._read = True
        holder = autoscaler_lease.holder_of(self._autoscaler, now)
        if self.leading and holder is not None and holder != self.holder:
            # Taken over while this one could not renew (its caches failing): follow at once, rather than
            # hold its own job for want of a view it no longer needs.
            log.info("the sidecar %s decides for namespace %s now; %s follows", holder, self.kube.namespace, self.job)
            self._follow()

    def stop(self) -> None:
        """Stop following, for good: a leading sidecar hands the namespace on at once (it deletes its Lease,
        as long as it is still the version it wrote), and no Lease is written after this returns."""
        with self._writing:
            self._stopped = True
            if self.leading:
                try:
                    self.kube.delete("leases", autoscaler_lease.LEASE_NAME, version=self._leader_version)
                except KubeConflictError:
                    pass  # taken over meanwhile: not ours to delete
                except EdlError as e:
                    log.warning("could not hand the autoscaler Lease on (it lapses by itself): %s", e)
                self.leading = False
        self._stop_caches()

    def _stop_caches(self) -> None:
        if self._caches_started:
            for c in self._caches:
                c.stop()
            self._build_caches()  # and the old ones, with what they held, are dropped

    def healthy(self) -> bool:
        """The autoscaler Lease was read this period, and a leader's caches are current (or still on their first
        list: then ``lead`` says it does not decide yet, and the size is held for want of a plan)."""
        return bool(self._read) and (not self.leading or all(
            c.healthy() or (c.lists == 0 and c.last_error is None) for c in self._caches))

    # ------------------------------------------------------------ who decides
    def lead(self, now: float) -> bool:
        """Whether this sidecar decides now. Called every period while the view is current, whatever else the
        sidecar can do: the deciding one renews its Lease here (with the lines it last published) when half
        of it has passed, so that it keeps the namespace while it cannot plan (its master away, its first list
        running). A deciding one whose caches fail is not current: it stops renewing, another takes the
        namespace once the Lease lapses, and ``refresh`` makes this one follow."""
        with self._writing:
            return not self._stopped and self._lead(now)

    def _lead(self, now: float) -> bool:
        lease = self._autoscaler
        holder = autoscaler_lease.holder_of(lease, now)
        if holder is not None and holder != self.holder:
            if self.leading:
                log.info("the sidecar %s decides for namespace %s now; %s follows", holder, self.kube.namespace,
                         self.job)
                self._follow()
            return False
        if self.leading:
            if now - self._renewed_at >= self.lease_duration_s / 2 and not self._write(self._lines, now):
                return False
        elif holder is None:  # nobody holds it (or it lapsed): take it
            if not self._take(lease, now):
                return False
        else:  # ours, renewed before this sidecar restarted
            assert lease is not None
            self._leader_version, self._renewed_at = lease["metadata"]["resourceVersion"], now
        if not self.leading:
            log.info("%s's sidecar decides for the jobs of namespace %s", self.job, self.kube.namespace)
            self.leading = True
        if not self._caches_started:
            for c in self._caches:
                c.start()
            self._caches_started = True
        return all(c.healthy() for c in self._caches)  # listed: it may decide

    def _follow(self) -> None:
        self.leading = False
        self._lines = None
        self._stop_caches()

    def _lease(self, lines: dict[str, PlanLine] | None, now: float) -> dict:
        body = autoscaler_lease.autoscaler_lease(self.kube.namespace, self.holder, self.job, now, self.lease_duration_s,
                                                 self._leader_labels, lines)
        if self.owner is not None:  # the holder's pod owns it: gone with that pod, the next sidecar creates it
            body["metadata"]["ownerReferences"] = owner_references(self.owner, controller=False)
        return body

    def _take(self, lease: dict | None, now: float) -> bool:
        """Take the Lease: create it, or replace the lapsed one at the version read; ``False`` when another
        sidecar got there first."""
        body = self._lease(None, now)
        try:
            if lease is None:
                written, created = self.kube.create(body)
                if not created:
                    return False
            else:
                body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
                written = self.kube.replace(body)
        except (KubeConflictError, KubeNotFoundError):
            return False
        self._leader_version, self._renewed_at, self._lines = written["metadata"]["resourceVersion"], now, None
        return True

    def _write(self, lines: dict[str, PlanLine] | None, now: float) -> bool:
        """Renew the Lease at the version this sidecar wrote last; on a conflict, read it: still ours (a write
        whose answer was lost), write again at its version; another's, follow. ``False``: it follows now."""
        body = self._lease(lines, now)
        for _ in range(2):
            body["metadata"]["resourceVersion"] = self._leader_version
            try:
                self._leader_version = self.kube.replace(body)["metadata"]["resourceVersion"]
                self._renewed_at, self._lines = now, lines
                return True
            except (KubeConflictError, KubeNotFoundError):
                fresh = self.kube.get("leases", autoscaler_lease.LEASE_NAME)
                if fresh is None or (fresh.get("spec") or {}).get("holderIdentity") != self.holder:
                    break
                self._leader_version = fresh["metadata"]["resourceVersion"]
        log.info("the autoscaler Lease of namespace %s was taken: %s follows", self.kube.namespace, self.job)
        self._follow()
        return False

    def publish_plan(self, lines: dict[str, PlanLine], now: float) -> bool:
        """Renew the autoscaler Lease with every job's line; ``False`` when it was taken (this one follows)."""
        with self._writing:
            return not self._stopped and self.leading and self._write(lines, now)

    def plan_line(self, job: str, now: float) -> PlanLine | None:
        return autoscaler_lease.plan_line(self._autoscaler, job, now)

    # ------------------------------------------------------------ the leader's reads
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
        with self._writing:
            if not self._stopped:
                self._publish(demand, now, reason)

    def _publish(self, demand: JobDemand, now: float, reason: SizeReason | None) -> None:
        lease = demand_lease(demand, self.lease_name, self.kube.namespace, self.holder, now, self.lease_duration_s,
                             self.lease_labels, reason)
        if self.owner is not None:
            lease["metadata"]["ownerReferences"] = owner_references(self.owner, controller=False)
        # A follower does not watch the demands: it writes at the version it last wrote, read again on a conflict.
        version = self._demand_version
        for _ in range(3):  # optimistic concurrency: re-read on a conflict
            if version is None:
                current, created = self.kube.create(lease)
                if created:
                    self._demand_version = current["metadata"]["resourceVersion"]
                    return
                version = current["metadata"]["resourceVersion"]
            lease["metadata"]["resourceVersion"] = version
            try:
                self._demand_version = self.kube.replace(lease)["metadata"]["resourceVersion"]
                return
            except (KubeConflictError, KubeNotFoundError):  # changed or deleted since read: read again
                fresh = self.kube.get("leases", self.lease_name)
                version = None if fresh is None else fresh["metadata"]["resourceVersion"]
        raise TemporaryError(f"lease {self.lease_name}: kept conflicting")
