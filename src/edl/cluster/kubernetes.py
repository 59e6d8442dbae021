"""The Kubernetes edge: the few API calls edl makes, and informer caches of nodes, pods and leases.

Everything goes through the official ``kubernetes`` client (transport, auth,
kubeconfig or in-cluster config, watch streams); objects travel as plain dicts
(``_preload_content=False``) and the caches keep only the fields the policy
needs, so a 5,000-node, 150,000-pod cluster fits in well under 1 GiB.

Effects are idempotent: creating an object that exists returns the existing one
(a retried launcher adopts its job), deleting one that is gone is a no-op.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from kubernetes.utils.quantity import parse_quantity

from edl.api.cluster import Node, Pod, PodPhase, Resources
from edl.errors import PermanentError, TemporaryError

log = logging.getLogger("edl.kubernetes")
GIB = float(2 ** 30)
GPU_KEY = "nvidia.com/gpu"
T = TypeVar("T")

# resource -> (API class, method suffix, namespaced)
_RESOURCES: dict[str, tuple[str, str, bool]] = {
    "pods": ("core", "pod", True),
    "services": ("core", "service", True),
    "secrets": ("core", "secret", True),
    "events": ("core", "event", True),
    "podtemplates": ("core", "pod_template", True),
    "leases": ("coordination", "lease", True),
    "nodes": ("core", "node", False),
    "priorityclasses": ("scheduling", "priority_class", False),
}
KIND_TO_RESOURCE = {"Pod": "pods", "Service": "services", "Secret": "secrets", "Event": "events",
                    "PodTemplate": "podtemplates", "Lease": "leases", "Node": "nodes"}


def load_api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster config inside a pod, else the kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``)."""
    try:
        if kubeconfig is None:
            config.load_incluster_config()
            return client.ApiClient()
    except config.ConfigException:
        pass
    try:
        return config.new_client_from_config(config_file=kubeconfig)
    except (config.ConfigException, FileNotFoundError) as e:
        raise PermanentError(f"no Kubernetes configuration: not in a pod and no usable kubeconfig ({e})") from e


def _temporary(e: Exception) -> bool:
    return isinstance(e, (urllib3.exceptions.HTTPError, OSError)) or (
        isinstance(e, ApiException) and (e.status in (0, 429) or (e.status or 0) >= 500))


class KubeApi:
    """Create, get, list, replace and delete plain-dict objects in one namespace (nodes: cluster-wide)."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self._apis = {"core": client.CoreV1Api(api_client), "coordination": client.CoordinationV1Api(api_client),
                      "scheduling": client.SchedulingV1Api(api_client)}

    def _call(self, verb: str, resource: str, *args: Any, all_namespaces: bool = False, **kw: Any) -> Any:
        api_name, suffix, namespaced = _RESOURCES[resource]
        api = self._apis[api_name]
        if all_namespaces:
            fn = getattr(api, f"{verb}_{suffix}_for_all_namespaces")
        elif namespaced:
            fn = getattr(api, f"{verb}_namespaced_{suffix}")
            # The client's order: create(ns, body), read/delete(name, ns), replace(name, ns, body), list(ns).
            if verb == "create":
                args = (self.namespace, *args)
            elif verb == "list":
                args = (self.namespace,)
            else:
                args = (args[0], self.namespace, *args[1:])
        else:
            fn = getattr(api, f"{verb}_{suffix}")
        try:
            resp = fn(*args, _preload_content=False, **kw)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise TemporaryError(f"Kubernetes API unreachable: {e}") from e
        return json.loads(resp.data) if resp.data else None

    def list_fn(self, resource: str, all_namespaces: bool = False) -> Callable[..., Any]:
        """The raw list function (for watches)."""
        api_name, suffix, namespaced = _RESOURCES[resource]
        api = self._apis[api_name]
        if all_namespaces or not namespaced:
            name = f"list_{suffix}_for_all_namespaces" if namespaced else f"list_{suffix}"
            return getattr(api, name)
        fn = getattr(api, f"list_namespaced_{suffix}")
        return lambda **kw: fn(self.namespace, **kw)

    def create(self, obj: dict) -> tuple[dict, bool]:
        """Create ``obj``; if it already exists return the existing object. Second value: created now."""
        resource = KIND_TO_RESOURCE[obj["kind"]]
        try:
            return self._call("create", resource, obj), True
        except ApiException as e:
            if e.status == 409:
                existing = self.get(resource, obj["metadata"]["name"])
                if existing is not None:
                    return existing, False
            raise self._error(e, "create", resource, obj["metadata"].get("name", "")) from e

    def get(self, resource: str, name: str) -> dict | None:
        try:
            return self._call("read", resource, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise self._error(e, "read", resource, name) from e

    def replace(self, obj: dict) -> dict:
        resource = KIND_TO_RESOURCE[obj["kind"]]
        try:
            return self._call("replace", resource, obj["metadata"]["name"], obj)
        except ApiException as e:
            raise self._error(e, "replace", resource, obj["metadata"]["name"]) from e

    def patch(self, resource: str, name: str, ops: list[dict]) -> dict:
        """A JSON patch (RFC 6902; the client sends a list as one): exact, lists replaced, not merged."""
        try:
            return self._call("patch", resource, name, ops)
        except ApiException as e:
            raise self._error(e, "patch", resource, name) from e

    def delete(self, resource: str, name: str, grace_s: int | None = None) -> bool:
        """Delete; ``False`` when it was already gone."""
        kw = {} if grace_s is None else {"grace_period_seconds": grace_s}
        try:
            self._call("delete", resource, name, **kw)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise self._error(e, "delete", resource, name) from e

    def list(self, resource: str, selector: str | None = None) -> list[dict]:
        kw = {"label_selector": selector} if selector else {}
        try:
            return self._call("list", resource, **kw)["items"]
        except ApiException as e:
            raise self._error(e, "list", resource, selector or "") from e

    @staticmethod
    def _error(e: ApiException, verb: str, resource: str, name: str) -> Exception:
        what = f"{verb} {resource} {name!r}: HTTP {e.status} {e.reason}"
        if _temporary(e):
            return TemporaryError(f"Kubernetes API: {what}")
        if e.status in (401, 403):
            return PermanentError(f"Kubernetes API refused to {what} (check the ServiceAccount's RBAC)")
        return PermanentError(f"Kubernetes API: {what}")


# ----------------------------------------------------------------- decoding
def quantity(value: Any) -> float:
    return float(parse_quantity(value)) if value is not None else 0.0


def _requests(spec: dict) -> Resources:
    """A pod's effective request: the sum over its containers, at least its largest init container."""
    def of(c: dict) -> tuple[float, float, float]:
        r = (c.get("resources") or {}).get("requests") or {}
        return quantity(r.get("cpu")), quantity(r.get("memory")) / GIB, quantity(r.get(GPU_KEY))

    cs = [of(c) for c in spec.get("containers") or []]
    total = [sum(x[i] for x in cs) for i in range(3)]
    for ic in (of(c) for c in spec.get("initContainers") or []):
        total = [max(total[i], ic[i]) for i in range(3)]
    overhead = spec.get("overhead") or {}
    return Resources(total[0] + quantity(overhead.get("cpu")), total[1] + quantity(overhead.get("memory")) / GIB,
                     total[2])


_PHASES = {"Pending": PodPhase.PENDING, "Running": PodPhase.RUNNING, "Succeeded": PodPhase.SUCCEEDED,
           "Failed": PodPhase.FAILED, "Unknown": PodPhase.RUNNING}  # Unknown: still holds its node


def decode_pod(obj: dict) -> Pod:
    meta, spec = obj["metadata"], obj.get("spec") or {}
    labels = meta.get("labels") or {}
    job = labels.get("edl.dev/job")
    role = labels.get("edl.dev/role")
    ns = meta.get("namespace", "")
    phase = _PHASES.get((obj.get("status") or {}).get("phase", "Pending"), PodPhase.PENDING)
    return Pod(name=f"{ns}/{meta['name']}", requests=_requests(spec), phase=phase,
               priority=int(spec.get("priority") or 0), node=spec.get("nodeName"),
               job=f"{ns}/{job}" if job else None,
               role="trainer" if role == "trainer" else ("fixed" if job else "other"))


def decode_node(obj: dict) -> Node | None:
    """A node the scheduler may place pods on; ``None`` if cordoned or not Ready."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if spec.get("unschedulable"):
        return None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") != "True":
            return None
    a = status.get("allocatable") or {}
    return Node(obj["metadata"]["name"], Resources(quantity(a.get("cpu")), quantity(a.get("memory")) / GIB,
                                                   quantity(a.get(GPU_KEY))))


# ----------------------------------------------------------------- informer
@dataclass
class _State(Generic[T]):
    items: dict[str, T]
    resource_version: str | None = None


class Informer(Generic[T]):
    """A watch-driven cache: list once, then apply watch events; re-list only on 410 Gone.

    ``decode`` turns an object into the cached value (or ``None`` to drop it). Keys
    are ``namespace/name``. Readers get a consistent copy of the values with
    ``values()``; ``synced`` says whether the cache reflects a recent list+watch.
    """

    def __init__(self, name: str, list_fn: Callable[..., Any], decode: Callable[[dict], T | None],
                 selector: str | None = None, page: int = 500, watch_timeout_s: int = 60) -> None:
        self.name = name
        self.list_fn = list_fn
        self.decode = decode
        self.selector = selector
        self.page = page
        self.watch_timeout_s = watch_timeout_s
        self._lock = threading.Lock()
        self._state: _State[T] = _State({})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: watch.Watch | None = None
        self.lists = 0  # how many full lists were needed (1 plus one per 410)
        self.last_error: str | None = None

    @staticmethod
    def key(obj: dict) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"

    def _kw(self) -> dict:
        return {"label_selector": self.selector} if self.selector else {}

    def relist(self) -> None:
        """A paginated list: a consistent snapshot and the resourceVersion to watch from."""
        items: dict[str, T] = {}
        token: str | None = None
        while True:
            kw = {**self._kw(), "limit": self.page, "_preload_content": False}
            if token:
                kw["_continue"] = token
            body = json.loads(self.list_fn(**kw).data)
            for obj in body.get("items") or []:
                value = self.decode(obj)
                if value is not None:
                    items[self.key(obj)] = value
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                break
        with self._lock:
            self._state = _State(items, body["metadata"]["resourceVersion"])
        self.lists += 1
        log.debug("%s: listed %d objects at resourceVersion %s", self.name, len(items),
                  self._state.resource_version)

    def watch_once(self) -> None:
        """Apply one watch stream's events (until its timeout); raises ``ApiException`` 410 when expired."""
        w = watch.Watch(return_type="object")  # plain dicts: no model classes for 150k pods
        self._watch = w
        for event in w.stream(self.list_fn, resource_version=self._state.resource_version,
                              timeout_seconds=self.watch_timeout_s, allow_watch_bookmarks=True, **self._kw()):
            if self._stop.is_set():
                w.stop()
                break
            obj, kind = event["raw_object"], event["type"]
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            with self._lock:
                if kind in ("ADDED", "MODIFIED"):
                    value = self.decode(obj)
                    if value is None:
                        self._state.items.pop(self.key(obj), None)
                    else:
                        self._state.items[self.key(obj)] = value
                elif kind == "DELETED":
                    self._state.items.pop(self.key(obj), None)
                if rv:
                    self._state.resource_version = rv

    def sync_step(self) -> None:
        """One round: list if needed, then watch. 410 Gone means: list again next round."""
        if self._state.resource_version is None:
            self.relist()
        try:
            self.watch_once()
        except ApiException as e:
            if e.status == 410:
                log.info("%s: watch expired (410 Gone), listing again", self.name)
                with self._lock:
                    self._state.resource_version = None
                return
            raise

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self.sync_step()
                backoff = 0.5
                self.last_error = None
            except Exception as e:  # noqa: BLE001 - any failure: keep the cache, retry with backoff
                if not _temporary(e) and not isinstance(e, (ApiException, TemporaryError)):
                    log.exception("%s: unexpected error", self.name)
                self.last_error = str(e).splitlines()[0] if str(e) else type(e).__name__
                log.warning("%s: %s; retrying in %.1f s", self.name, self.last_error, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def start(self) -> "Informer[T]":
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, wait_s: float = 0.5) -> None:
        """Stop following. A watch blocked on a quiet stream ends at its timeout; the thread is a
        daemon, so a process that exits does not wait for it."""
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout=wait_s)

    def values(self) -> list[T]:
        with self._lock:
            return list(self._state.items.values())

    def get(self, key: str) -> T | None:
        with self._lock:
            return self._state.items.get(key)

    def healthy(self) -> bool:
        """Listed at least once and the last list or watch did not fail."""
        with self._lock:
            return self._state.resource_version is not None and self.last_error is None

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.healthy():
                return True
            time.sleep(0.05)
        return False


# ------------------------------------------------------------- sidecar view
class KubeClusterView:
    """The sidecar's ``ClusterView`` on Kubernetes: informer caches of nodes, pods and demand Leases.

    No full list per period: the caches follow watch events. Demands are Leases in
    the sidecar's namespace labelled ``edl.dev/role=demand`` (the namespaced Role allows
    only that); jobs in other namespaces still count, as the pods they run.
    """

    LEASE_SELECTOR = "edl.dev/role=demand"

    def __init__(self, kube: KubeApi, job: str, holder: str, lease_duration_s: int,
                 watch_timeout_s: int = 60, owner: dict | None = None) -> None:
        from edl.cluster.manifests import labels, names

        self.kube = kube
        self.job = job
        self.holder = holder
        self.owner = owner  # {"name", "uid"} of the pod the sidecar runs in: the Lease goes with it
        self.lease_name = names(job)["lease"]
        self.lease_labels = labels(job, "demand")
        self.lease_duration_s = lease_duration_s
        self.node_cache = Informer("nodes", kube.list_fn("nodes"), decode_node, watch_timeout_s=watch_timeout_s)
        self.pod_cache = Informer("pods", kube.list_fn("pods", all_namespaces=True), decode_pod,
                                  watch_timeout_s=watch_timeout_s)
        self.lease_cache = Informer("leases", kube.list_fn("leases"), lambda o: o, selector=self.LEASE_SELECTOR,
                                    watch_timeout_s=watch_timeout_s)
        self._caches = (self.node_cache, self.pod_cache, self.lease_cache)

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
        return self.pod_cache.values()

    def peer_demands(self, now: float):
        from edl.cluster.demand_lease import demand_from_lease

        out = []
        for obj in self.lease_cache.values():
            d = demand_from_lease(obj, now)
            if d is not None:
                out.append(d)
        return out

    def publish(self, demand, now: float) -> None:
        from edl.cluster.demand_lease import demand_lease

        lease = demand_lease(demand, self.lease_name, self.kube.namespace, self.holder, now, self.lease_duration_s,
                             self.lease_labels)
        if self.owner is not None:
            from edl.cluster.manifests import owner_references

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
            except PermanentError as e:
                if "HTTP 409" not in str(e) and "HTTP 404" not in str(e):
                    raise
                fresh = self.kube.get("leases", self.lease_name)
                version = None if fresh is None else fresh["metadata"]["resourceVersion"]
        raise TemporaryError(f"lease {self.lease_name}: kept conflicting")
