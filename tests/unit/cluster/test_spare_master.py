"""``KubeCluster``'s spare master pod: made beside the serving master, woken in its place when the serving
one is deleted or lost (no pod to create, schedule, pull and start), and left for a new master when it
cannot take over."""

from __future__ import annotations

import base64

from edl.api.spec import JobSpec, K8sOptions
from edl.cluster import manifests as m
from edl.cluster.kube_cluster import STANDBY_AFTER_S, KubeCluster
from edl.errors import KubeNotFoundError, TemporaryError
from edl.storage.claim import FENCE_S
from tests.clock import FakeClock

SPEC = JobSpec(job="mnist", model_def="m", data="s3://d/x", epochs=1, batch_size=1, min_trainers=1,
               max_trainers=2, trainers=1, checkpoint_uri="s3://c/mnist")
FIRST, SECOND = "edl-mnist-master", "edl-mnist-master-b"


class PodsKube:
    """Pods, a Service and a Secret in memory. A created pod runs and is Ready with an IP at once; a graceful
    delete marks it terminating until ``gone``; a delete with no grace removes it."""

    namespace = "ml"

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict] = {}
        self.ips = iter(f"10.0.0.{i}" for i in range(1, 100))
        self.calls: list[tuple[str, str]] = []

    def create(self, obj: dict) -> tuple[dict, bool]:
        resource = {"Pod": "pods", "Service": "services", "Secret": "secrets"}[obj["kind"]]
        key = (resource, obj["metadata"]["name"])
        if key in self.objects:
            return self.objects[key], False
        obj = {**obj, "metadata": {**obj["metadata"], "uid": f"uid-{len(self.calls)}"}}
        if resource == "secrets":
            obj["data"] = {"token": base64.b64encode(obj["stringData"]["token"].encode()).decode()}
        if resource == "pods":
            obj["status"] = {"phase": "Running", "podIP": next(self.ips),
                             "conditions": [{"type": "Ready", "status": "True"}],
                             "containerStatuses": [{"name": "master", "restartCount": 0, "state": {"running": {}}}]}
        self.objects[key] = obj
        self.calls.append(("create", obj["metadata"]["name"]))
        return obj, True

    def get(self, resource: str, name: str) -> dict | None:
        return self.objects.get((resource, name))

    def list(self, resource: str, selector: str | None = None) -> list[dict]:
        wanted = dict(kv.split("=") for kv in (selector or "").split(",") if kv)
        return [o for (r, _), o in self.objects.items()
                if r == resource and all(o["metadata"]["labels"].get(k) == v for k, v in wanted.items())]

    def patch(self, resource: str, name: str, ops: list[dict]) -> dict:
        obj = self.objects.get((resource, name))
        if obj is None:
            raise KubeNotFoundError(f"{resource} {name} not found")
        for op in ops:
            if op["path"] == "/metadata/labels/edl.dev~1master":
                obj["metadata"]["labels"][m.MASTER_STATE_LABEL] = op["value"]
            elif op["path"] == "/spec/selector":
                obj["spec"]["selector"] = op["value"]
        self.calls.append(("patch", name))
        return obj

    def delete(self, resource: str, name: str, grace_s: int | None = None) -> bool:
        self.calls.append((f"delete grace={grace_s}", name))
        obj = self.objects.get((resource, name))
        if obj is None:
            return False
        if grace_s == 0:
            del self.objects[(resource, name)]
        else:
            obj["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
        return True

    def gone(self, name: str) -> None:
        del self.objects[("pods", name)]

    def state(self, name: str) -> str | None:
        pod = self.get("pods", name)
        return None if pod is None else pod["metadata"]["labels"][m.MASTER_STATE_LABEL]


def started(kube: PodsKube, woken: list, clock: FakeClock, fail_wake: bool = False) -> KubeCluster:
    """A job whose master serves and whose spare waits (made ``STANDBY_AFTER_S`` after the master)."""
    def wake(address: str, token: str, await_handover_s: float) -> None:
        if fail_wake:
            raise TemporaryError(f"standby master at {address} unreachable: ConnectError")
        woken.append((address, token, await_handover_s))

    c = KubeCluster(kube, SPEC, K8sOptions(namespace="ml"), master_via="pod-ip", clock=clock, sleep=clock.sleep,
                    wake_spare=wake)
    c.ensure_job()
    assert c.master_alive() and kube.get("pods", SECOND) is None  # not beside the master's own start
    clock.t += STANDBY_AFTER_S
    assert c.master_alive()
    return c


def test_a_spare_master_waits_beside_the_serving_one_and_the_service_selects_only_the_serving_one():
    kube, clock = PodsKube(), FakeClock(0.0)
    started(kube, [], clock)
    assert kube.state(FIRST) == m.SERVING and kube.state(SECOND) == m.STANDBY
    spare = kube.get("pods", SECOND)["spec"]["containers"][0]
    assert spare["args"][-4:] == ["--standby", "http", "--serving-master", "edl-mnist-master.ml.svc:8470"]
    assert kube.get("services", FIRST)["spec"]["selector"][m.MASTER_STATE_LABEL] == m.SERVING


def test_a_master_being_deleted_is_replaced_by_its_spare_at_once_which_waits_for_the_lock_handed_over():
    kube, clock, woken = PodsKube(), FakeClock(0.0), []
    c = started(kube, woken, clock)
    spare_ip = kube.get("pods", SECOND)["status"]["podIP"]
    kube.delete("pods", FIRST)  # preempted, evicted, or kubectl delete: terminating, its master stopping
    assert not c.master_alive()  # not once it is gone: now
    kube.calls.clear()
    assert c.recreate_master() == f"{spare_ip}:8470"
    assert woken == [(f"{spare_ip}:8470", c.token, FENCE_S)]
    assert kube.state(FIRST) == m.RETIRED and kube.state(SECOND) == m.SERVING
    assert not any(call.startswith(("create", "delete")) for call, _ in kube.calls)
    assert c.serving == SECOND and c.master_alive()
    # The next spare goes under the first name once the retired pod is gone.
    kube.gone(FIRST)
    clock.t += STANDBY_AFTER_S
    assert c.master_alive() and kube.state(FIRST) == m.STANDBY


def test_a_master_gone_without_a_trace_is_replaced_by_its_spare_which_fences_it():
    kube, clock, woken = PodsKube(), FakeClock(0.0), []
    c = started(kube, woken, clock)
    kube.gone(FIRST)  # deleted by force, or its node lost
    assert not c.master_alive()
    c.recreate_master()
    assert [w[2] for w in woken] == [0.0]  # it takes the lock now: a predecessor that lives on is fenced


def test_a_master_that_stopped_answering_is_retired_and_deleted_when_its_spare_takes_over():
    kube, clock, woken = PodsKube(), FakeClock(0.0), []
    c = started(kube, woken, clock)
    c.recreate_master()  # the launcher judged it silent: its pod still runs
    assert kube.state(FIRST) == m.RETIRED and ("delete grace=None", FIRST) in kube.calls
    assert [w[2] for w in woken] == [0.0]


def test_a_spare_that_cannot_be_woken_is_deleted_and_a_new_master_made_as_without_one():
    kube, clock = PodsKube(), FakeClock(0.0)
    c = started(kube, [], clock, fail_wake=True)
    kube.gone(FIRST)
    c.recreate_master()
    assert ("delete grace=0", SECOND) in kube.calls and kube.get("pods", SECOND) is None
    assert kube.state(FIRST) == m.SERVING and c.serving == FIRST  # a new master under the serving name


def test_a_spare_not_ready_yet_is_not_woken():
    kube, clock, woken = PodsKube(), FakeClock(0.0), []
    c = started(kube, woken, clock)
    kube.get("pods", SECOND)["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    kube.delete("pods", FIRST)
    assert c.master_alive()  # terminating, and nothing to take over yet: it is waited out as before
    kube.gone(FIRST)
    c.recreate_master()
    assert woken == [] and c.serving == FIRST and kube.state(FIRST) == m.SERVING


def test_an_adopting_launcher_finds_the_serving_master_by_its_label_and_wakes_a_spare_left_unwoken():
    kube, clock, woken = PodsKube(), FakeClock(0.0), []
    c = started(kube, woken, clock)
    kube.gone(FIRST)
    kube.patch("pods", SECOND, [{"op": "add", "path": "/metadata/labels/edl.dev~1master", "value": m.SERVING}])
    # The launcher died here, before it woke the spare; a retried step adopts the job.
    again = KubeCluster(kube, SPEC, K8sOptions(namespace="ml"), master_via="pod-ip", clock=clock, sleep=clock.sleep,
                        wake_spare=lambda *a: woken.append(a))
    endpoint = again.ensure_job()
    assert endpoint.adopted and again.serving == SECOND
    assert woken == [(f"{kube.get('pods', SECOND)['status']['podIP']}:8470", c.token, 0.0)]


def test_a_spare_that_ended_is_replaced():
    kube, clock = PodsKube(), FakeClock(0.0)
    c = started(kube, [], clock)
    kube.get("pods", SECOND)["status"]["phase"] = "Succeeded"  # stopped (SIGTERM) before it was needed
    clock.t += STANDBY_AFTER_S
    c.master_alive()
    assert ("delete grace=None", SECOND) in kube.calls
    kube.gone(SECOND)
    clock.t += STANDBY_AFTER_S
    c.master_alive()
    assert kube.state(SECOND) == m.STANDBY


def test_a_woken_spare_whose_container_restarted_in_place_is_woken_again():
    kube, clock, woken = PodsKube(), FakeClock(0.0), []
    c = started(kube, woken, clock)
    kube.gone(FIRST)
    c.recreate_master()
    assert c.master_alive() and len(woken) == 1
    status = kube.get("pods", SECOND)["status"]
    status["containerStatuses"][0]["restartCount"] = 1  # it crashed: its container runs --standby http again
    status["conditions"] = [{"type": "Ready", "status": "False"}]
    assert c.master_alive() and len(woken) == 1  # not up yet
    status["conditions"] = [{"type": "Ready", "status": "True"}]
    assert c.master_alive()
    assert woken[-1] == (f"{status['podIP']}:8470", c.token, 0.0)
    assert c.master_alive() and len(woken) == 2  # once per restart


def test_a_master_evicted_from_a_node_that_is_not_ready_is_a_lost_nodes_master_deleted_by_force():
    kube, clock, woken = PodsKube(), FakeClock(0.0), []
    c = started(kube, woken, clock)
    kube.get("pods", FIRST)["spec"]["nodeName"] = "n1"
    kube.objects[("nodes", "n1")] = {"metadata": {"name": "n1"},
                                     "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    kube.delete("pods", FIRST)  # the node lifecycle controller's eviction, before --node-lost-timeout
    kube.calls.clear()
    assert not c.master_alive()
    assert ("delete grace=0", FIRST) in kube.calls  # nobody on that node confirms a graceful delete
