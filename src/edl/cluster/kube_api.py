"""The Kubernetes API edge: the few calls edl makes and their failures as typed errors. With the
decoders of its objects (``kube_objects``), the only module that imports the ``kubernetes`` client.

Everything goes through the official client (transport, auth, kubeconfig or in-cluster
config, watch streams); objects travel as plain dicts (``_preload_content=False``), which
``kube_objects`` reads.

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
from tenacity import before_sleep_log, retry, retry_if_exception_type, stop_after_delay, wait_exponential

from edl.errors import (EdlError, KubeConflictError, KubeExpiredError, KubeForbiddenError, KubeNotFoundError,
                        KubeRefusedError, KubeUnavailableError, PermanentError)

log = logging.getLogger("edl.kubernetes")
# (connect, read) seconds for one request; a watch reads for up to its own timeout plus this.
REQUEST_TIMEOUT_S = (5.0, 20.0)
GIVE_UP_S = 10.0  # how long one call retries an unavailable API before the caller hears of it
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
    """In-cluster config inside a pod, else the kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``).

    No retries inside urllib3 (its default is three more tries of each request, read timeouts
    included, each logged): ``KubeApi`` owns retrying, so one request is bounded by its timeout."""
    cfg = client.Configuration()
    cfg.retries = False
    try:
        if kubeconfig is None:
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(cfg)
    except config.ConfigException:
        pass
    try:
        return config.new_client_from_config(config_file=kubeconfig, client_configuration=cfg)
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

    def delete(self, resource: str, name: str, grace_s: int | None = None, version: str | None = None) -> bool:
        """Delete; ``False`` when it was already gone. ``version``: only that version of it
        (``KubeConflictError`` when it changed since)."""
        kw: dict[str, Any] = {} if grace_s is None else {"grace_period_seconds": grace_s}
        if version is not None:
            kw["body"] = client.V1DeleteOptions(preconditions=client.V1Preconditions(resource_version=version))
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
