"""The Kubernetes adapter over real HTTP against FakeKubeApiServer (a test double: no cluster here)."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from edl.autoscale.model import PodPhase
from edl.cluster import manifests as m
from edl.cluster.kubernetes import Informer, KubeApi, decode_node, decode_pod
from edl.errors import PermanentError, TemporaryError
from edl.master.job import JobSpec
from tests.kube_double import TOKEN, FakeKubeApiServer

pytestmark = pytest.mark.timeout(60)

SPEC = JobSpec(job="mnist", model_def="edl.zoo.digits", data="s3://d/digits", epochs=1, batch_size=8,
               min_trainers=1, max_trainers=3, trainers=1, checkpoint_uri="s3://c/mnist")
OPTS = m.K8sOptions(namespace="ml", s3_secret="minio", trainer_cpu="2", trainer_memory="4Gi")


def api_client(url: str, token: str = TOKEN) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = url
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    cfg.retries = False
    return client.ApiClient(cfg)


@pytest.fixture
def api():
    with FakeKubeApiServer(history=50) as fake:
        yield fake


def until(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def test_create_is_idempotent_and_keeps_labels_and_owner(api):
    kube = KubeApi(api_client(api.url), "ml")
    owner = {"name": "launcher", "uid": "u-1"}
    pod = m.master_pod(SPEC, OPTS, owner)
    created, fresh = kube.create(pod)
    assert fresh and created["metadata"]["uid"]
    again, fresh2 = kube.create(pod)  # a retried launcher adopts what exists (409 -> read)
    assert not fresh2 and again["metadata"]["uid"] == created["metadata"]["uid"]
    stored = api.pod("ml", "edl-mnist-master")
    assert stored["metadata"]["labels"]["edl.dev/role"] == "master"
    assert stored["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert [p["metadata"]["name"] for p in kube.list("pods", "edl.dev/job=mnist")] == ["edl-mnist-master"]
    assert kube.delete("pods", "edl-mnist-master") is True
    assert kube.delete("pods", "edl-mnist-master") is False  # already gone: fine
    assert kube.get("pods", "edl-mnist-master") is None


def test_replace_with_a_stale_version_is_a_conflict(api):
    kube = KubeApi(api_client(api.url), "ml")
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "l", "namespace": "ml"}, "spec": {"holderIdentity": "a"}}
    first, _ = kube.create(lease)
    first["spec"]["holderIdentity"] = "b"
    kube.replace(first)
    first["spec"]["holderIdentity"] = "c"  # still carries the old resourceVersion
    with pytest.raises(PermanentError, match="409"):
        kube.replace(first)


def test_wrong_token_and_unreachable_api_are_reported_as_such(api):
    with pytest.raises(PermanentError, match="RBAC"):
        KubeApi(api_client(api.url, token="nope"), "ml").list("pods")
    with pytest.raises(TemporaryError, match="unreachable"):
        KubeApi(api_client("http://127.0.0.1:1"), "ml").list("pods")


def test_informer_follows_watch_events_and_relists_only_after_410(api):
    for i in range(7):
        api.add_node(f"n{i}", cpu="8", memory="32Gi")
    kube = KubeApi(api_client(api.url), "ml")
    nodes = Informer("nodes", kube.list_fn("nodes"), decode_node, page=3, watch_timeout_s=1).start()
    pods = Informer("pods", kube.list_fn("pods", all_namespaces=True), decode_pod, watch_timeout_s=1).start()
    try:
        assert nodes.wait_synced(10) and pods.wait_synced(10)
        assert len(nodes.values()) == 7 and nodes.lists == 1  # three pages, one list
        kube.create(m.trainer_pod(SPEC, OPTS, "edl-mnist-trainer-a"))
        until(lambda: pods.get("ml/edl-mnist-trainer-a") is not None)
        p = pods.get("ml/edl-mnist-trainer-a")
        assert (p.job, p.role, p.phase, p.requests.cpu, p.requests.memory) == ("ml/mnist", "trainer",
                                                                               PodPhase.PENDING, 2.0, 4.0)
        api.set_pod("ml", "edl-mnist-trainer-a", "Running", node="n3")
        until(lambda: pods.get("ml/edl-mnist-trainer-a").phase is PodPhase.RUNNING)
        assert pods.get("ml/edl-mnist-trainer-a").node == "n3"
        # Cordoning a node drops it from the schedulable set.
        node = api.objects("nodes")[0]
        node["spec"] = {"unschedulable": True}
        api.store.put("nodes", node)
        until(lambda: len(nodes.values()) == 6)
        lists_before = pods.lists
        time.sleep(1.5)  # several watch rounds with nothing new: no re-list
        assert pods.lists == lists_before
        # History compacted while the watch is between rounds: the next watch gets 410 and lists again.
        api.compact()
        kube.delete("pods", "edl-mnist-trainer-a")
        until(lambda: pods.get("ml/edl-mnist-trainer-a") is None)  # converges after compaction too
    finally:
        nodes.stop()
        pods.stop()


def test_informer_relists_on_410_gone(api):
    kube = KubeApi(api_client(api.url), "ml")
    inf = Informer("pods", kube.list_fn("pods"), decode_pod, watch_timeout_s=1)
    inf.relist()
    assert inf.lists == 1
    for i in range(60):  # more changes than the double keeps (history=50)
        kube.create(m.trainer_pod(SPEC, OPTS, f"edl-mnist-trainer-{i}"))
    api.compact()
    inf.sync_step()  # the watch from the old version is answered with 410 Expired
    assert inf._state.resource_version is None
    inf.sync_step()  # so it lists again, then watches
    assert inf.lists == 2 and len(inf.values()) == 60


def test_decode_pod_effective_requests():
    pod = {"metadata": {"name": "p", "namespace": "x", "labels": {}},
           "spec": {"priority": 1000, "nodeName": "n1",
                    "containers": [{"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                                   {"resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}}],
                    "initContainers": [{"resources": {"requests": {"cpu": "4", "memory": "512Mi"}}}]},
           "status": {"phase": "Running"}}
    p = decode_pod(pod)
    assert (p.requests.cpu, p.requests.memory, p.requests.gpu) == (4.0, 1.0, 1.0)
    assert (p.priority, p.node, p.job, p.role) == (1000, "n1", None, "other")
