"""The Kubernetes API edge without a server: failures to typed errors, pod status to edl's phase
and trainer exit, and the sidecar's Lease write retrying on a typed conflict."""

from __future__ import annotations

import socket

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from edl.api.cluster import JobDemand, PodPhase, Resources, TrainerExit
from edl.cluster.kube_api import KubeApi, ListWatch, api_error
from edl.cluster.kube_objects import cannot_start, decode_pod, last_exit, pod_phase, trainer_exit
from edl.cluster.kube_view import KubeClusterView
from edl.errors import (KubeConflictError, KubeExpiredError, KubeForbiddenError, KubeNotFoundError, KubeRefusedError,
                        KubeUnavailableError, PermanentError, TemporaryError)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("status, kind", [
    (409, KubeConflictError), (404, KubeNotFoundError), (410, KubeExpiredError),
    (429, KubeUnavailableError), (500, KubeUnavailableError), (503, KubeUnavailableError),
    (504, KubeUnavailableError), (0, KubeUnavailableError),
    (400, KubeRefusedError), (401, KubeForbiddenError), (403, KubeForbiddenError), (422, KubeRefusedError),
])
def test_each_status_maps_to_one_error_type(status, kind):
    e = api_error(ApiException(status=status, reason="Why"), "replace", "leases", "edl-mnist-demand")
    assert type(e) is kind
    assert isinstance(e, TemporaryError if kind is KubeUnavailableError else PermanentError)
    text = str(e)
    assert "\n" not in text and f"HTTP {status} Why" in text
    assert "replace leases 'edl-mnist-demand'" in text


def test_conflict_not_found_and_expired_are_refusals_a_caller_may_catch_as_one():
    for status in (409, 404, 410):
        assert isinstance(api_error(ApiException(status=status), "get", "pods", "p"), KubeRefusedError)


@pytest.mark.parametrize("status", [401, 403])
def test_unauthorized_and_forbidden_point_at_rbac(status):
    assert "RBAC" in str(api_error(ApiException(status=status, reason="Forbidden"), "list", "pods", ""))


@pytest.mark.parametrize("cause", [
    urllib3.exceptions.MaxRetryError(None, "/api", "refused"),
    urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out"),
    urllib3.exceptions.ProtocolError("connection reset"),
    ConnectionRefusedError(111, "Connection refused"),
    socket.timeout("timed out"),
])
def test_no_answer_is_temporary(cause):
    e = api_error(cause, "list", "pods", "edl.dev/job=mnist")
    assert type(e) is KubeUnavailableError and isinstance(e, TemporaryError)
    assert str(e).startswith("Kubernetes API unreachable: list pods 'edl.dev/job=mnist'")


class _Resp:
    def __init__(self, body: bytes) -> None:
        self.data = body


class _FakeLeases:
    """``CoordinationV1Api`` for one Lease: each call answers the next of ``answers`` (bytes or an error)."""

    def __init__(self, answers: list) -> None:
        self.answers = answers
        self.calls: list[str] = []

    def _next(self, verb: str):
        self.calls.append(verb)
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return _Resp(a)

    def create_namespaced_lease(self, ns, body, **kw):
        return self._next("create")

    def read_namespaced_lease(self, name, ns, **kw):
        return self._next("read")

    def replace_namespaced_lease(self, name, ns, body, **kw):
        return self._next("replace")

    def delete_namespaced_lease(self, name, ns, **kw):
        return self._next("delete")


def kube_with(answers: list, give_up_s: float = 0.0) -> tuple[KubeApi, _FakeLeases]:
    # No request leaves the process; give_up_s 0: one attempt, unless a test is about the retries.
    kube = KubeApi(client.ApiClient(client.Configuration()), "ml", give_up_s=give_up_s)
    fake = _FakeLeases(answers)
    kube._apis["coordination"] = fake
    return kube, fake


LEASE = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l", "namespace": "ml"}}


def test_create_adopts_an_object_that_exists_and_get_and_delete_treat_404_as_gone():
    kube, fake = kube_with([ApiException(status=409, reason="AlreadyExists"), b'{"metadata": {"name": "l"}}',
                            ApiException(status=404), ApiException(status=404)])
    assert kube.create(LEASE) == ({"metadata": {"name": "l"}}, False)
    assert kube.get("leases", "l") is None
    assert kube.delete("leases", "l") is False
    assert fake.calls == ["create", "read", "read", "delete"]


def test_create_conflicting_with_an_object_gone_again_is_the_conflict():
    kube, _ = kube_with([ApiException(status=409, reason="AlreadyExists"), ApiException(status=404)])
    with pytest.raises(KubeConflictError, match="create leases 'l': HTTP 409"):
        kube.create(LEASE)


def test_replace_raises_the_typed_error_and_transport_failures_are_temporary():
    kube, _ = kube_with([ApiException(status=409, reason="Conflict"), ApiException(status=503),
                         urllib3.exceptions.MaxRetryError(None, "/", "refused")])
    with pytest.raises(KubeConflictError):
        kube.replace(LEASE)
    with pytest.raises(KubeUnavailableError, match="HTTP 503"):
        kube.replace(LEASE)
    with pytest.raises(KubeUnavailableError, match="unreachable"):
        kube.get("leases", "l")


def test_an_unavailable_api_is_retried_with_backoff_until_it_answers():
    kube, fake = kube_with([ApiException(status=503), ApiException(status=429),
                            urllib3.exceptions.ProtocolError("connection reset"), b'{"metadata": {"name": "l"}}'],
                           give_up_s=10.0)
    assert kube.get("leases", "l") == {"metadata": {"name": "l"}}
    assert fake.calls == ["read"] * 4


def test_retries_are_bounded_and_refusals_are_not_retried():
    kube, fake = kube_with([ApiException(status=503)] * 100, give_up_s=0.5)
    with pytest.raises(KubeUnavailableError, match="HTTP 503"):
        kube.get("leases", "l")
    assert 1 < len(fake.calls) < 10
    kube, fake = kube_with([ApiException(status=403), b"{}"], give_up_s=10.0)
    with pytest.raises(KubeRefusedError, match="403"):
        kube.get("leases", "l")
    assert fake.calls == ["read"]


def test_every_request_and_watch_has_a_client_side_timeout():
    seen: list[dict] = []

    def list_fn(**kw):
        seen.append(kw)
        return _Resp(b'{"items": [], "metadata": {"resourceVersion": "1"}}')

    lw = ListWatch("pods", list_fn)
    lw.page(None, 10, None)
    assert seen[0]["_request_timeout"]
    stream = lw.watch(None, "1", timeout_s=30)
    connect, read = stream._kw["_request_timeout"]
    assert connect > 0 and read > 30  # longer than the server's own end of the stream, not forever
    kube, _ = kube_with([])
    calls: list[dict] = []

    class Leases:
        def read_namespaced_lease(self, name, ns, **kw):
            calls.append(kw)
            return _Resp(b"{}")

    kube._apis["coordination"] = Leases()
    kube.get("leases", "l")
    assert calls[0]["_request_timeout"]


def test_an_informer_list_page_maps_its_errors_too():
    def gone(**kw):
        raise ApiException(status=410, reason="Expired")

    with pytest.raises(KubeExpiredError, match="list leases 'edl.dev/role=demand'"):
        ListWatch("leases", gone).page("edl.dev/role=demand", 500, "token")


# ------------------------------------------------- the demand Lease on a conflict
class _LeaseKube:
    """The three calls ``publish`` makes; ``replace`` fails with the queued errors first."""

    namespace = "ml"

    def __init__(self, replace_errors: list[Exception], stored_version: str | None = "7") -> None:
        self.replace_errors = replace_errors
        self.stored_version = stored_version
        self.replaced: list[str] = []
        self.created = 0

    def list_watch(self, resource: str, all_namespaces: bool = False) -> ListWatch:
        return ListWatch(resource, lambda **kw: None)  # the caches are not started here

    def create(self, obj: dict) -> tuple[dict, bool]:
        self.created += 1
        return obj, True

    def get(self, resource: str, name: str) -> dict | None:
        return None if self.stored_version is None else {"metadata": {"resourceVersion": self.stored_version}}

    def replace(self, obj: dict) -> dict:
        self.replaced.append(obj["metadata"]["resourceVersion"])
        if self.replace_errors:
            raise self.replace_errors.pop(0)
        return obj


DEMAND = JobDemand("ml/mnist", 1, 4, 2, Resources(2, 1, 0))


def published(kube: _LeaseKube) -> KubeClusterView:
    view = KubeClusterView(kube, "mnist", "master-0", lease_duration_s=30)
    view._demand_version = "5"  # the version it wrote last
    view.publish(DEMAND, now=1000.0)
    return view


def test_publish_rereads_the_lease_after_a_conflict():
    kube = _LeaseKube([KubeConflictError("Kubernetes API: replace leases 'edl-mnist-demand': HTTP 409 Conflict")])
    published(kube)
    assert kube.replaced == ["5", "7"] and kube.created == 0


def test_publish_creates_the_lease_again_after_it_was_deleted():
    kube = _LeaseKube([KubeNotFoundError("Kubernetes API: replace leases 'edl-mnist-demand': HTTP 404")],
                      stored_version=None)
    published(kube)
    assert kube.replaced == ["5"] and kube.created == 1


def test_publish_passes_other_refusals_on_and_gives_up_after_three_conflicts():
    with pytest.raises(KubeRefusedError, match="403"):
        published(_LeaseKube([KubeRefusedError("Kubernetes API refused to replace leases: HTTP 403")]))
    kube = _LeaseKube([KubeConflictError("409")] * 3)
    with pytest.raises(TemporaryError, match="kept conflicting"):
        published(kube)
    assert kube.replaced == ["5", "7", "7"]


# ------------------------------------------------------------------ pod phase
def pod(phase: str | None = None, **status) -> dict:
    body = {"metadata": {"name": "edl-mnist-trainer-0", "namespace": "ml"}, "spec": {}}
    if phase is not None or status:
        body["status"] = {**({"phase": phase} if phase is not None else {}), **status}
    return body


@pytest.mark.parametrize("phase, expected", [
    ("Pending", PodPhase.PENDING), ("Running", PodPhase.RUNNING), ("Succeeded", PodPhase.SUCCEEDED),
    ("Failed", PodPhase.FAILED),
    ("Unknown", PodPhase.RUNNING),  # its node stopped reporting: the pod still holds the node
    ("SomethingNew", PodPhase.PENDING),
])
def test_pod_phase(phase, expected):
    assert pod_phase(pod(phase)) is expected
    assert decode_pod(pod(phase)).phase is expected  # the informer's decoder uses the same map


def test_a_pod_without_status_or_phase_is_pending():
    assert pod_phase(pod()) is PodPhase.PENDING
    assert pod_phase({**pod(), "status": None}) is PodPhase.PENDING
    assert pod_phase(pod(None, podIP="10.0.0.1")) is PodPhase.PENDING


def test_a_pod_being_deleted_keeps_its_phase_until_it_is_gone():
    deleting = pod("Running")
    deleting["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    assert pod_phase(deleting) is PodPhase.RUNNING and not pod_phase(deleting).terminated


# ------------------------------------------------------------------ trainer exit
def terminated(code: int, reason: str = "", message: str = "", phase: str = "Failed") -> dict:
    return pod(phase, containerStatuses=[{"name": "trainer", "state": {"terminated": {
        "exitCode": code, "reason": reason, "message": message}}}])


def test_trainer_exit_from_a_container_exit_code():
    assert trainer_exit(terminated(0, phase="Succeeded")) == (TrainerExit.SUCCEEDED, "")
    assert trainer_exit(terminated(2, message="x\nedl: error: --data s3://nope: no such bucket")) == (
        TrainerExit.USER_ERROR, "--data s3://nope: no such bucket")
    assert trainer_exit(terminated(137)) == (TrainerExit.PREEMPTED, "killed by the system (exit 137)")
    assert trainer_exit(terminated(143)) == (TrainerExit.PREEMPTED, "killed by the system (exit 143)")
    assert trainer_exit(terminated(1, "Error", "Traceback\nValueError: nan")) == (
        TrainerExit.FAILED, "exit code 1 (Error): ValueError: nan")


def test_trainer_exit_oom_names_the_memory_limit():
    p = terminated(137, "OOMKilled")
    p["spec"]["containers"] = [{"resources": {"limits": {"memory": "1Gi"}}}]
    kind, message = trainer_exit(p)
    assert kind is TrainerExit.OOM_KILLED and "memory limit 1Gi" in message and "--trainer-memory" in message


def test_trainer_exit_from_the_pod_status():
    assert trainer_exit(pod("Failed", reason="Evicted", message="low on ephemeral storage")) == (
        TrainerExit.PREEMPTED, "evicted: low on ephemeral storage")
    assert trainer_exit(pod("Failed", reason="NodeLost")) == (TrainerExit.NODE_LOST, "its node was lost")
    disrupted = pod("Failed", conditions=[{"type": "DisruptionTarget", "status": "True",
                                          "reason": "PreemptionByScheduler", "message": "by batch-high"}])
    assert trainer_exit(disrupted) == (TrainerExit.PREEMPTED, "PreemptionByScheduler: by batch-high")
    assert trainer_exit(pod("Succeeded")) == (TrainerExit.SUCCEEDED, "")
    assert trainer_exit(pod("Failed")) == (TrainerExit.FAILED, "failed without a container exit")
    assert trainer_exit(pod("Failed", message="DeadlineExceeded")) == (TrainerExit.FAILED, "DeadlineExceeded")


# ------------------------------------------------- containers that cannot start, restarted masters
def waiting(reason: str, message: str = "", name: str = "trainer", image: str = "registry.example/edl:9") -> dict:
    p = pod("Pending", containerStatuses=[{"name": name, "image": image, "restartCount": 0,
                                           "state": {"waiting": {"reason": reason, "message": message}}}])
    p["spec"]["containers"] = [{"name": name, "image": image}]
    return p


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"])
def test_an_image_that_cannot_be_pulled_is_named(reason):
    why = cannot_start(waiting(reason, 'Back-off pulling image "registry.example/edl:9"\nmore'))
    assert why == (f"pod edl-mnist-trainer-0: image 'registry.example/edl:9' cannot be pulled ({reason}: "
                   'Back-off pulling image "registry.example/edl:9")')


def test_a_missing_secret_key_is_named():
    why = cannot_start(waiting("CreateContainerConfigError", 'couldn\'t find key secret_key in Secret ml/minio'))
    assert why == "pod edl-mnist-trainer-0: container trainer cannot be configured: " \
                  "couldn't find key secret_key in Secret ml/minio"


@pytest.mark.parametrize("reason", ["ContainerCreating", "PodInitializing", "CrashLoopBackOff", "ErrImagePull"])
def test_a_container_on_its_way_can_still_start(reason):
    assert cannot_start(waiting(reason)) is None
    assert cannot_start(pod("Running")) is None and cannot_start(pod()) is None


def test_last_exit_reads_the_state_or_the_exit_before_the_last_restart():
    crashing = pod("Running", containerStatuses=[
        {"name": "sidecar", "restartCount": 0, "state": {"running": {}}},
        {"name": "master", "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
         "lastState": {"terminated": {"exitCode": 2, "message": "loading\nedl: error: --data s3://d/x: no Parquet files"}}}])
    assert last_exit(crashing, "master") == (2, "edl: error: --data s3://d/x: no Parquet files", 2)
    assert last_exit(crashing, "sidecar") is None
    ended = pod("Failed", containerStatuses=[{"name": "master", "restartCount": 0,
                                              "state": {"terminated": {"exitCode": 1, "message": "boom"}}}])
    assert last_exit(ended, "master") == (1, "boom", 0)


def test_a_node_is_read_with_its_labels_and_taints():
    from edl.cluster.kube_objects import decode_node

    node = decode_node({"metadata": {"name": "n1", "labels": {"pool": "training"}},
                        "spec": {"taints": [{"key": "dedicated", "value": "training", "effect": "NoSchedule"},
                                            {"key": "gpu", "effect": "NoExecute"}]},
                        "status": {"allocatable": {"cpu": "4", "memory": "16Gi"},
                                   "conditions": [{"type": "Ready", "status": "True"}]}})
    assert node.labels == (("pool", "training"),)
    assert node.taints == (("dedicated", "training", "NoSchedule"), ("gpu", "", "NoExecute"))


# ------------------------------------------------- who decides, read once a period
class _ElectionKube(_LeaseKube):
    """The namespace's autoscaler Lease as ``refresh`` reads it: ``lease``, or ``away`` raised."""

    def __init__(self) -> None:
        super().__init__([])
        self.lease: dict | None = None
        self.away: Exception | None = None
        self.deleted: list[str] = []

    def get(self, resource: str, name: str) -> dict | None:
        if name == "edl-autoscaler":
            if self.away is not None:
                raise self.away
            return self.lease
        return super().get(resource, name)

    def create(self, obj: dict) -> tuple[dict, bool]:
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": "1"}}
        if obj["metadata"]["name"] == "edl-autoscaler":
            self.lease = obj
        return obj, True

    def delete(self, resource: str, name: str, version: str | None = None, **kw) -> bool:
        self.deleted.append(name)
        return True


def test_a_view_reads_who_decides_each_period_and_follows_once_another_took_it():
    from edl.cluster.autoscaler_lease import autoscaler_lease

    kube = _ElectionKube()
    view = KubeClusterView(kube, "a", "pod-a", lease_duration_s=30)
    assert not view.healthy()  # nothing read yet
    kube.away = KubeUnavailableError("Kubernetes API unreachable")
    view.refresh(1000.0)
    assert not view.healthy()  # the read failed: the size is held
    kube.away = None
    view.refresh(1000.0)
    view._caches_started = True  # no cluster to list here: the caches are not started
    assert view.healthy()
    view.lead(1000.0)
    assert view.leading and kube.lease["spec"]["holderIdentity"] == "pod-a"  # nobody held it: taken
    kube.lease = autoscaler_lease("ml", "pod-b", "b", 1010.0, 30, {})  # b took it while a could not renew
    view.refresh(1011.0)
    assert not view.leading and not view._caches_started  # a follows at once
    assert not view.lead(1011.0)
    view.stop()
    assert kube.deleted == []  # not a's to hand on


def test_a_stopped_view_writes_no_lease():
    kube = _ElectionKube()
    view = KubeClusterView(kube, "a", "pod-a", lease_duration_s=30)
    view.refresh(1000.0)
    view._caches_started = True  # no cluster to list here: the caches are not started
    view.lead(1000.0)
    assert view.leading
    view.stop()
    assert kube.deleted == ["edl-autoscaler"] and not view.leading  # handed on
    created = kube.created
    kube.lease = None
    view.refresh(1001.0)
    assert not view.lead(1001.0) and not view.publish_plan({}, 1001.0)  # a decision still in flight: nothing
    view.publish(DEMAND, 1001.0)
    assert kube.created == created and kube.lease is None and kube.replaced == []
