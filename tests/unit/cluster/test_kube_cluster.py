"""``KubeCluster`` over a Kubernetes API in memory: what it makes of a master that restarts in
place (``restartPolicy: Always``), of trainers that can never start, and of pods on a lost node."""

from __future__ import annotations

import pytest

from edl.api.cluster import PodPhase, TrainerExit
from edl.api.spec import JobSpec, K8sOptions
from edl.cluster.kube_cluster import KubeCluster
from edl.errors import KubeForbiddenError, PermanentError, UserError
from tests.clock import FakeClock

SPEC = JobSpec(job="mnist", model_def="m", data="s3://d/x", epochs=1, batch_size=1, min_trainers=1,
               max_trainers=2, trainers=1, checkpoint_uri="s3://c/mnist")


class MemoryKube:
    """``get`` and ``list`` of pods and nodes, from dicts; deletes recorded with their grace period."""

    namespace = "ml"

    def __init__(self, pods: dict[str, dict], nodes: dict[str, dict] | None = None) -> None:
        self.pods = pods
        self.nodes = nodes or {}
        self.deleted: list[tuple[str, int | None]] = []

    def get(self, resource: str, name: str) -> dict | None:
        return (self.nodes if resource == "nodes" else self.pods).get(name)

    def delete(self, resource: str, name: str, grace_s: int | None = None) -> bool:
        self.deleted.append((name, grace_s))
        return self.pods.pop(name, None) is not None

    def list(self, resource: str, selector: str | None = None) -> list[dict]:
        return [p for p in self.pods.values() if "trainer" in p["metadata"]["name"]]


def master(*statuses: dict, phase: str = "Running") -> dict:
    return {"metadata": {"name": "edl-mnist-master"}, "spec": {"containers": [{"name": "master", "image": "edl:1"}]},
            "status": {"phase": phase, "containerStatuses": list(statuses)}}


def restarted(code: int, message: str, restarts: int) -> dict:
    return {"name": "master", "restartCount": restarts, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": code, "message": message}}}


def cluster(pods: list[dict]) -> KubeCluster:
    return KubeCluster(MemoryKube({p["metadata"]["name"]: p for p in pods}), SPEC, K8sOptions(namespace="ml"))


def test_a_master_that_refused_its_data_fails_the_job_with_its_own_reason_after_one_restart():
    c = cluster([master(restarted(2, "reading\nedl: error: --data s3://d/x: no Parquet files under it", 1))])
    with pytest.raises(UserError) as e:
        c.master_alive()
    assert str(e.value) == "--data s3://d/x: no Parquet files under it"


def test_a_master_that_keeps_crashing_fails_the_job_with_its_last_exit():
    c = cluster([master(restarted(1, "Traceback\nRuntimeError: boom", 3))])
    with pytest.raises(PermanentError, match=r"master of job mnist keeps crashing \(3 restarts\); last exit 1: "
                                             "RuntimeError: boom"):
        c.master_alive()
    assert cluster([master(restarted(1, "RuntimeError: boom", 1))]).master_alive()  # one crash: it may recover


def test_a_master_whose_image_cannot_be_pulled_fails_the_job_naming_it():
    c = cluster([master({"name": "master", "restartCount": 0,
                         "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}},
                        phase="Pending")])
    with pytest.raises(PermanentError, match="master of job mnist cannot start: .*image 'edl:1' cannot be pulled"):
        c.master_alive()


def test_trainers_that_cannot_start_are_reported_so_with_the_reason():
    stuck = {"metadata": {"name": "edl-mnist-trainer-1", "creationTimestamp": "2026-01-01T00:00:00Z"},
             "spec": {"containers": [{"name": "trainer", "image": "nope:1"}]},
             "status": {"phase": "Pending", "containerStatuses": [
                 {"name": "trainer", "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                           "message": "couldn't find key key in Secret ml/minio"}}}]}}
    [t] = cluster([stuck]).trainers()
    assert t.phase is PodPhase.PENDING and t.exit is TrainerExit.CANNOT_START
    assert t.message == ("trainer pod edl-mnist-trainer-1: container trainer cannot be configured: "
                         "couldn't find key key in Secret ml/minio")


class DyingKube(MemoryKube):
    """A master pod that takes ``grace_s`` (on the clock) to go after a graceful delete; the API away
    while ``away(t)``; ``create`` answers 409 with what exists under the name, as ``KubeApi.create`` does."""

    def __init__(self, clock, grace_s: float, away=lambda t: False) -> None:
        super().__init__({"edl-mnist-master": {**master(phase="Running"), "metadata": {
            "name": "edl-mnist-master", "uid": "old"}}})
        self.clock, self.grace_s, self.away = clock, grace_s, away
        self.gone_at: float | None = None
        self.log: list[tuple[str, float]] = []

    def get(self, resource: str, name: str) -> dict | None:
        from edl.errors import KubeUnavailableError

        if self.away(self.clock.t):
            raise KubeUnavailableError("Kubernetes API unreachable: get pods: connection refused")
        if self.gone_at is not None and self.clock.t >= self.gone_at and self.pods.get(name, {}).get(
                "metadata", {}).get("uid") == "old":
            del self.pods[name]
        return self.pods.get(name)

    def delete(self, resource: str, name: str, grace_s: int | None = None) -> bool:
        self.log.append((f"delete grace={grace_s}", self.clock.t))
        self.gone_at = self.clock.t + (self.grace_s if grace_s is None else grace_s)
        return True

    def create(self, obj: dict) -> tuple[dict, bool]:
        self.log.append(("create", self.clock.t))
        existing = self.get("pods", obj["metadata"]["name"])
        if existing is not None:
            return existing, False
        pod = {**obj, "metadata": {**obj["metadata"], "uid": "new"}}
        self.pods[obj["metadata"]["name"]] = pod
        return pod, True



def node(name: str, ready: str) -> dict:
    return {"metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": ready}]}}


def on(pod: dict, node_name: str) -> dict:
    pod["spec"]["nodeName"] = node_name
    return pod


def trainer(name: str, node_name: str) -> dict:
    return {"metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": node_name, "containers": [{"name": "trainer", "image": "t:1"}]},
            "status": {"phase": "Running"}}


def lost_node_cluster(pods: list[dict], clock: FakeClock, forbidden: bool = False) -> tuple[KubeCluster, MemoryKube]:
    kube = MemoryKube({p["metadata"]["name"]: p for p in pods}, {"good": node("good", "True"),
                                                                   "bad": node("bad", "Unknown")})
    if forbidden:
        def refuse(resource: str, name: str) -> dict | None:
            if resource == "nodes":
                raise KubeForbiddenError("Kubernetes API refused to read nodes 'bad': HTTP 403 Forbidden")
            return kube.pods.get(name)
        kube.get = refuse  # type: ignore[method-assign]
    return KubeCluster(kube, SPEC, K8sOptions(namespace="ml", node_lost_timeout_s=60), clock=clock), kube


def test_trainers_on_a_node_unknown_past_the_deadline_are_lost_and_deleted_by_force():
    clock = FakeClock(1000.0)
    c, kube = lost_node_cluster([trainer("edl-mnist-trainer-1", "good"), trainer("edl-mnist-trainer-2", "bad")],
                                clock)
    assert [t.phase for t in c.trainers()] == [PodPhase.RUNNING, PodPhase.RUNNING]  # the clock starts now
    clock.t += 59
    assert all(t.exit is None for t in c.trainers())
    clock.t += 1
    good, bad = c.trainers()
    assert good.phase is PodPhase.RUNNING and good.exit is None
    assert bad.phase is PodPhase.FAILED and bad.exit is TrainerExit.NODE_LOST
    assert bad.message == "its node bad is not Ready (Unknown) for over 60 s"
    c.delete_trainer(bad.name)
    c.delete_trainer(good.name)
    assert kube.deleted == [("edl-mnist-trainer-2", 0), ("edl-mnist-trainer-1", None)]  # only the lost one by force


def test_a_master_on_a_lost_node_is_deleted_by_force_and_reported_not_alive():
    clock = FakeClock(1000.0)
    c, kube = lost_node_cluster([on(master({"name": "master", "restartCount": 0, "state": {"running": {}}}),
                                    "bad")], clock)
    assert c.master_alive()
    clock.t += 61
    assert not c.master_alive()
    assert kube.deleted == [("edl-mnist-master", 0)]


def test_without_permission_to_read_nodes_pods_are_judged_as_before():
    clock = FakeClock(1000.0)
    c, _ = lost_node_cluster([trainer("edl-mnist-trainer-2", "bad")], clock, forbidden=True)
    c.trainers()
    clock.t += 600
    [t] = c.trainers()
    assert t.phase is PodPhase.RUNNING and not c.nodes_readable


def dying_cluster(kube: DyingKube, clock: FakeClock) -> KubeCluster:
    return KubeCluster(kube, SPEC, K8sOptions(namespace="ml"), clock=clock, sleep=clock.sleep)


def test_a_lost_master_is_deleted_gracefully_and_its_successor_created_only_once_it_is_gone():
    clock = FakeClock(0.0)
    kube = DyingKube(clock, grace_s=12.0, away=lambda t: 3 <= t < 8)  # the API away meanwhile: held
    dying_cluster(kube, clock).recreate_master()
    (delete, t_delete), (create, t_create) = kube.log
    assert delete == "delete grace=None" and create == "create"  # the pod's own grace period, not 0
    assert t_create >= t_delete + 12.0
    assert kube.pods["edl-mnist-master"]["metadata"]["uid"] == "new"


class ReschedulingKube(DyingKube):
    """The old master has the IP 10.0.0.1; its successor gets 10.0.0.2 two seconds after it is created
    (scheduled, its sandbox up), as a kubelet reports ``status.podIP``."""

    def __init__(self, clock) -> None:
        super().__init__(clock, grace_s=5.0)
        self.pods["edl-mnist-master"]["status"]["podIP"] = "10.0.0.1"
        self.created_at: float | None = None

    def get(self, resource: str, name: str) -> dict | None:
        pod = super().get(resource, name)
        if pod is not None and pod["metadata"]["uid"] == "new" and self.clock.t >= (self.created_at or 0) + 2:
            pod.setdefault("status", {})["podIP"] = "10.0.0.2"
        return pod

    def create(self, obj: dict) -> tuple[dict, bool]:
        self.created_at = self.clock.t
        return super().create(obj)


def test_with_pod_ip_a_recreated_master_is_reached_at_its_own_ip_not_its_predecessors():
    clock = FakeClock(0.0)
    kube = ReschedulingKube(clock)
    c = KubeCluster(kube, SPEC, K8sOptions(namespace="ml"), master_via="pod-ip", clock=clock, sleep=clock.sleep)
    assert c._master_address() == "10.0.0.1:8470"
    assert c.recreate_master() == "10.0.0.2:8470"
    assert clock.t >= kube.created_at + 2  # waited for the successor's IP


class EvictingKube(ReschedulingKube):
    """The successor is evicted before it gets an address (its node went away just after it was bound)."""

    def get(self, resource: str, name: str) -> dict | None:
        pod = super().get(resource, name)
        if pod is not None and pod["metadata"]["uid"] == "new" and self.clock.t >= (self.created_at or 0) + 1:
            del self.pods[name]
            return None
        return pod


def test_a_recreated_master_evicted_before_it_got_an_address_is_given_up_at_once():
    from edl.errors import TemporaryError

    clock = FakeClock(0.0)
    kube = EvictingKube(clock)
    c = KubeCluster(kube, SPEC, K8sOptions(namespace="ml"), master_via="pod-ip", clock=clock, sleep=clock.sleep)
    with pytest.raises(TemporaryError, match="gone before it got an address"):
        c.recreate_master()  # it waited for an IP the pod would never get (300 s, then the job failed)
    assert clock.t < kube.created_at + 2
    assert not c.master_alive()  # the next round creates another


def test_the_master_is_created_preferring_the_node_the_plan_gives_it():
    from edl.cluster.manifests import preferred_node

    clock = FakeClock(0.0)
    for planned in ("n1", None):
        kube, asked = DyingKube(clock, grace_s=1.0), []
        c = KubeCluster(kube, SPEC, K8sOptions(namespace="ml"), clock=clock, sleep=clock.sleep,
                        place_master=lambda pod: asked.append(pod) or planned)
        c.recreate_master()
        assert [p["metadata"]["name"] for p in asked] == ["edl-mnist-master"]  # asked with the pod to create
        assert preferred_node(kube.pods["edl-mnist-master"]["spec"]) == planned


def test_through_the_service_a_recreated_master_keeps_the_services_address():
    clock = FakeClock(0.0)
    assert dying_cluster(DyingKube(clock, grace_s=1.0), clock).recreate_master() == "edl-mnist-master.ml.svc:8470"


def test_a_master_that_never_goes_is_not_adopted_back():
    from edl.errors import TemporaryError

    clock = FakeClock(1000.0)
    kube = DyingKube(clock, grace_s=10_000.0)
    with pytest.raises(TemporaryError, match="still terminating"):
        dying_cluster(kube, clock).recreate_master()
    assert [what for what, _ in kube.log] == ["delete grace=None"]  # no create beside the dying pod


def test_a_master_that_exited_0_is_not_alive_while_a_container_injected_beside_it_runs_on():
    done = {"name": "master", "restartCount": 0, "state": {"terminated": {"exitCode": 0, "message": ""}}}
    assert not cluster([master(done, {"name": "mesh-proxy", "state": {"running": {}}})]).master_alive()
    crashed = {"name": "master", "restartCount": 1, "state": {"terminated": {"exitCode": 1, "message": "x"}}}
    assert cluster([master(crashed)]).master_alive()  # restarted in place (OnFailure): alive
