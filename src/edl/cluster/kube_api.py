"""The Kubernetes API edge: the few calls edl makes, their failures as typed errors, and the
decoders from API objects to edl's types. The only module that imports the ``kubernetes`` client.

Everything goes through the official client (transport, auth, kubeconfig or in-cluster
config, watch streams); objects travel as plain dicts (``_preload_content=False``) and the
decoders keep only the fields the policy needs, so a 5,000-node, 150,000-pod cluster fits
in well under 1 GiB.

Effects are idempotent: creating an object that exists returns the existing one
(a retried launcher adopts its job), deleting one that is gone is a no-op.

Failures are typed (``edl.errors``), so callers catch what they handle instead of reading
messages: 409 ``KubeConflictError``, 404 ``KubeNotFoundError``, 410 ``KubeExpiredError``;
429, 5xx, connection errors and timeouts ``KubeUnavailableError`` (temporary); anything else
``KubeRefusedError`` (permanent).

Every request has a client-side timeout (a half-open connection must not block a caller
forever) and is retried with backoff while the API is unavailable, for up to ``give_up_s``
(apiservers answer 429/5xx routinely: upgrades, etcd leader changes, priority-and-fairness);
what is still unavailable after that reaches the caller as ``KubeUnavailableError``.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Iterator

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from kubernetes.utils.quantity import parse_quantity
from tenacity import before_sleep_log, retry, retry_if_exception_type, stop_after_delay, wait_exponential

from edl.api.cluster import Node, Pod, PodPhase, Resources, TrainerExit
from edl.console import clip
from edl.errors import (EdlError, KubeConflictError, KubeExpiredError, KubeForbiddenError, KubeNotFoundError,
                        KubeRefusedError, KubeUnavailableError, PermanentError)

log = logging.getLogger("edl.kubernetes")
GIB = float(2 ** 30)
# (connect, read) seconds for one request; a watch reads for up to its own timeout plus this.
REQUEST_TIMEOUT_S = (5.0, 20.0)
GIVE_UP_S = 10.0  # how long one call retries an unavailable API before the caller hears of it
GPU_KEY = "nvidia.com/gpu"
# What a request fails with when it gets no answer: refused or reset connections, timeouts.
_TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)

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
    "serviceaccounts": ("core", "service_account", True),
    "inferenceservices": ("custom", "serving.kserve.io/v1beta1", True),  # KServe's (the deploy step)
}
KIND_TO_RESOURCE = {"Pod": "pods", "Service": "services", "Secret": "secrets", "Event": "events",
                    "PodTemplate": "podtemplates", "Lease": "leases", "Node": "nodes",
                    "ServiceAccount": "serviceaccounts", "InferenceService": "inferenceservices"}
# The custom-object API's names for the verbs (its arguments: group, version, namespace, plural[, name][, body]).
_CUSTOM_VERBS = {"create": "create", "read": "get", "replace": "replace", "delete": "delete", "list": "list",
                 "patch": "patch"}


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


def api_error(e: Exception, verb: str, resource: str, name: str) -> EdlError:
    """The typed error for a failed call: an HTTP status (``ApiException``) or no answer at all."""
    if not isinstance(e, ApiException):
        return KubeUnavailableError(f"Kubernetes API unreachable: {verb} {resource} {name!r}: {e}")
    what = f"{verb} {resource} {name!r}: HTTP {e.status} {e.reason}"
    if e.status == 409:  # AlreadyExists on create, Conflict on a stale write
        return KubeConflictError(f"Kubernetes API: {what}")
    if e.status == 404:
        return KubeNotFoundError(f"Kubernetes API: {what}")
    if e.status == 410:
        return KubeExpiredError(f"Kubernetes API: {what}")
    if e.status in (0, 429) or (e.status or 0) >= 500:
        return KubeUnavailableError(f"Kubernetes API: {what}")
    if e.status in (401, 403):
        return KubeForbiddenError(f"Kubernetes API refused to {what} (check the ServiceAccount's RBAC)")
    return KubeRefusedError(f"Kubernetes API: {what}")


class KubeApi:
    """Create, get, list, replace and delete plain-dict objects in one namespace (nodes: cluster-wide)."""

    def __init__(self, api_client: client.ApiClient, namespace: str, give_up_s: float = GIVE_UP_S) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.give_up_s = give_up_s
        self._apis = {"core": client.CoreV1Api(api_client), "coordination": client.CoordinationV1Api(api_client),
                      "scheduling": client.SchedulingV1Api(api_client), "custom": client.CustomObjectsApi(api_client)}

    def _call(self, verb: str, resource: str, name: str, *args: Any, **kw: Any) -> Any:
        """One request; ``name`` (the object, or a list's selector) names it in an error."""
        api_name, suffix, namespaced = _RESOURCES[resource]
        api = self._apis[api_name]
        if api_name == "custom":  # suffix: group/version
            fn = getattr(api, f"{_CUSTOM_VERBS[verb]}_namespaced_custom_object")
            group, version = suffix.split("/")
            args = (group, version, self.namespace, resource, *args)
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

        def once() -> Any:
            try:
                return fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S, **kw).data
            except (ApiException, *_TRANSPORT_ERRORS) as e:
                raise api_error(e, verb, resource, name) from e

        data = retry(retry=retry_if_exception_type(KubeUnavailableError),
                     wait=wait_exponential(multiplier=0.2, max=2.0), stop=stop_after_delay(self.give_up_s),
                     before_sleep=before_sleep_log(log, logging.DEBUG), reraise=True)(once)()
        return json.loads(data) if data else None

    def list_watch(self, resource: str, all_namespaces: bool = False) -> "ListWatch":
        """What an informer follows: pages of ``resource``, then its watch events."""
        api_name, suffix, namespaced = _RESOURCES[resource]
        api = self._apis[api_name]
        if all_namespaces or not namespaced:
            return ListWatch(resource, getattr(api, f"list_{suffix}_for_all_namespaces" if namespaced
                                               else f"list_{suffix}"))
        fn = getattr(api, f"list_namespaced_{suffix}")
        return ListWatch(resource, lambda **kw: fn(self.namespace, **kw))

    def create(self, obj: dict) -> tuple[dict, bool]:
        """Create ``obj``; if it already exists return the existing object. Second value: created now."""
        resource, name = KIND_TO_RESOURCE[obj["kind"]], obj["metadata"].get("name", "")
        try:
            return self._call("create", resource, name, obj), True
        except KubeConflictError:
            existing = self.get(resource, name)
            if existing is not None:
                return existing, False
            raise

    def get(self, resource: str, name: str) -> dict | None:
        try:
            return self._call("read", resource, name, name)
        except KubeNotFoundError:
            return None

    def replace(self, obj: dict) -> dict:
        """Replace ``obj``; ``KubeConflictError`` when its ``resourceVersion`` is no longer current."""
        name = obj["metadata"]["name"]
        return self._call("replace", KIND_TO_RESOURCE[obj["kind"]], name, name, obj)

    def apply(self, obj: dict, attempts: int = 3) -> tuple[dict, bool]:
        """Create ``obj``, or replace the one there with it (its labels, annotations and body; the server
        keeps its status): the object ends up as given, however often this runs. Second value: created now."""
        resource, name = KIND_TO_RESOURCE[obj["kind"]], obj["metadata"]["name"]
        for attempt in range(attempts):
            current, created = self.create(obj)
            if created:
                return current, True
            meta = {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
            try:
                return self._call("replace", resource, name, name, {**obj, "metadata": meta}), False
            except KubeConflictError:  # changed between the read and the write: read it again
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def patch(self, resource: str, name: str, ops: list[dict]) -> dict:
        """A JSON patch (RFC 6902; the client sends a list as one): exact, lists replaced, not merged."""
        return self._call("patch", resource, name, name, ops)

    def delete(self, resource: str, name: str, grace_s: int | None = None) -> bool:
        """Delete; ``False`` when it was already gone."""
        kw = {} if grace_s is None else {"grace_period_seconds": grace_s}
        try:
            self._call("delete", resource, name, name, **kw)
            return True
        except KubeNotFoundError:
            return False

    def list(self, resource: str, selector: str | None = None) -> list[dict]:
        kw = {"label_selector": selector} if selector else {}
        return self._call("list", resource, selector or "", **kw)["items"]


class ListWatch:
    """One resource as an informer follows it: consistent pages, then watch streams from a version."""

    def __init__(self, resource: str, list_fn: Callable[..., Any]) -> None:
        self.resource = resource
        self._list_fn = list_fn

    def page(self, selector: str | None, limit: int, continue_token: str | None) -> dict:
        """One page of a list, the raw body: ``items`` and ``metadata`` (``continue``, ``resourceVersion``)."""
        kw: dict[str, Any] = {"limit": limit, "_preload_content": False, "_request_timeout": REQUEST_TIMEOUT_S}
        if selector:
            kw["label_selector"] = selector
        if continue_token:
            kw["_continue"] = continue_token
        try:
            data = self._list_fn(**kw).data
        except (ApiException, *_TRANSPORT_ERRORS) as e:
            raise api_error(e, "list", self.resource, selector or "") from e
        return json.loads(data)

    def watch(self, selector: str | None, resource_version: str | None, timeout_s: int) -> "WatchStream":
        # The server ends the stream after timeout_s; a half-open one is ended by the read timeout.
        kw: dict[str, Any] = {"resource_version": resource_version, "timeout_seconds": timeout_s,
                              "allow_watch_bookmarks": True,
                              "_request_timeout": (REQUEST_TIMEOUT_S[0], timeout_s + REQUEST_TIMEOUT_S[1])}
        if selector:
            kw["label_selector"] = selector
        return WatchStream(self.resource, selector, self._list_fn, kw)


class WatchStream:
    """One watch request's events as ``(type, plain-dict object)``, until its timeout or ``stop()``
    (from any thread). ``KubeExpiredError`` when the version to watch from was compacted away."""

    def __init__(self, resource: str, selector: str | None, list_fn: Callable[..., Any], kw: dict) -> None:
        self._what = (resource, selector or "")
        self._list_fn = list_fn
        self._kw = kw
        self._watch = watch.Watch(return_type="object")  # plain dicts: no model classes for 150k pods

    def __iter__(self) -> Iterator[tuple[str, dict]]:
        try:
            for event in self._watch.stream(self._list_fn, **self._kw):
                yield event["type"], event["raw_object"]
        except (ApiException, *_TRANSPORT_ERRORS) as e:
            raise api_error(e, "watch", *self._what) from e

    def stop(self) -> None:
        self._watch.stop()


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


def pod_phase(obj: dict) -> PodPhase:
    """A pod's phase as edl counts it; one without a status yet is pending. A pod being deleted
    keeps its phase until it is gone: it holds its node until then."""
    return _PHASES.get((obj.get("status") or {}).get("phase"), PodPhase.PENDING)


def trainer_exit(pod: dict) -> tuple[TrainerExit, str]:
    """Why a terminated trainer pod ended, from its status (evicted, OOMKilled, exit code...)."""
    status = pod.get("status") or {}
    name = pod["metadata"]["name"]
    if status.get("reason") == "Evicted":
        return TrainerExit.PREEMPTED, f"evicted: {status.get('message', '')}".strip()
    if status.get("reason") == "NodeLost":
        return TrainerExit.NODE_LOST, "its node was lost"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return TrainerExit.PREEMPTED, f"{cond.get('reason', 'disrupted')}: {cond.get('message', '')}".strip()
    term = None
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term:
            break
    if not term:
        if pod_phase(pod) is PodPhase.SUCCEEDED:
            return TrainerExit.SUCCEEDED, ""
        return TrainerExit.FAILED, status.get("message") or "failed without a container exit"
    code, reason = int(term.get("exitCode", 1)), term.get("reason", "")
    text = (term.get("message") or "").strip().splitlines()
    last = text[-1] if text else ""
    if code == 0:
        return TrainerExit.SUCCEEDED, ""
    if reason == "OOMKilled":
        limit = ""
        for c in (pod.get("spec") or {}).get("containers") or []:
            limit = ((c.get("resources") or {}).get("limits") or {}).get("memory", limit)
        return TrainerExit.OOM_KILLED, (f"trainer {name} was OOMKilled: its memory limit {limit or '(none)'} is too "
                                        "small for this model and batch size; raise --trainer-memory")
    if code == 2:
        return TrainerExit.USER_ERROR, last.removeprefix("edl: error: ") or f"trainer {name} refused the job"
    if code in (137, 143):  # killed from outside without OOM: the node or the scheduler took it back
        return TrainerExit.PREEMPTED, f"killed by the system (exit {code})"
    return TrainerExit.FAILED, f"exit code {code}{' (' + reason + ')' if reason else ''}: {clip(last)}"


# Waiting reasons that do not cure themselves: the image is not there, the container cannot be configured.
# ErrImagePull is the first failed pull, which the kubelet retries (a registry hiccup); the back-off
# after it means the retry failed too.
_PULL_FAILURES = ("ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
_CONFIG_FAILURES = ("CreateContainerConfigError",)


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:300] if lines else ""


def cannot_start(pod: dict) -> str | None:
    """Why one of a pod's containers can never start, one line naming the image or the missing
    Secret or key (the kubelet's message says which); ``None`` while it may still start."""
    status, name = pod.get("status") or {}, pod["metadata"]["name"]
    spec = pod.get("spec") or {}
    images = {c.get("name"): c.get("image") for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])}
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason, detail = waiting.get("reason"), _first_line(waiting.get("message"))
        if reason in _PULL_FAILURES:
            image = images.get(cs.get("name")) or cs.get("image")
            return f"pod {name}: image {image!r} cannot be pulled ({reason}{': ' + detail if detail else ''})"
        if reason in _CONFIG_FAILURES:
            return f"pod {name}: container {cs.get('name')} cannot be configured: {detail or reason}"
    return None


def last_exit(pod: dict, container: str) -> tuple[int, str, int] | None:
    """A container's latest exit: (exit code, last line of its message, restartCount). From
    ``state`` while it is terminated, else ``lastState``: a container that restarts (the master's
    ``restartPolicy: Always``) keeps its previous exit there. ``None`` if it never exited."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != container:
            continue
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if not term:
            return None
        lines = (term.get("message") or "").strip().splitlines()
        return int(term.get("exitCode", 1)), (lines[-1] if lines else "")[:300], int(cs.get("restartCount") or 0)
    return None


def decode_pod(obj: dict) -> Pod:
    meta, spec = obj["metadata"], obj.get("spec") or {}
    labels = meta.get("labels") or {}
    job = labels.get("edl.dev/job")
    role = labels.get("edl.dev/role")
    ns = meta.get("namespace", "")
    return Pod(name=f"{ns}/{meta['name']}", requests=_requests(spec), phase=pod_phase(obj),
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
    labels = tuple(sorted((obj["metadata"].get("labels") or {}).items()))
    taints = tuple((t.get("key", ""), t.get("value") or "", t.get("effect", "")) for t in spec.get("taints") or ())
    return Node(obj["metadata"]["name"], Resources(quantity(a.get("cpu")), quantity(a.get("memory")) / GIB,
                                                   quantity(a.get(GPU_KEY))), labels, taints)


def node_ready(obj: dict | None) -> str:
    """A node's Ready condition: "True", "False" or "Unknown" (also while it reports none yet);
    ``"gone"`` when there is no such Node."""
    if obj is None:
        return "gone"
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status") or "Unknown")
    return "Unknown"
