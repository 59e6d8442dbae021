"""The Kubernetes adapter and informers against the real apiserver of the test plane."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from edl.api.cluster import PlanLine, PodPhase, SizeCause, SizeReason
from edl.api.ledger import PodLedger
from edl.cluster import manifests as m
from edl.cluster import autoscaler_lease
from edl.cluster.informer import Informer
from edl.cluster.kube_api import KubeApi
from edl.cluster.kube_objects import decode_node, decode_pod
from edl.cluster.kube_view import KubeClusterView
from edl.errors import PermanentError, TemporaryError
from edl.api.spec import JobSpec, K8sOptions, with_trainer_images
from tests.integration.plane.test_plane import restricted_pod
from tests.waits import wait_for

pytestmark = pytest.mark.timeout(120)

SPEC = JobSpec(job="mnist", model_def="edl.zoo.digits", data="s3://d/digits", epochs=1, batch_size=8,
               min_trainers=1, max_trainers=3, trainers=1, checkpoint_uri="s3://c/mnist")


def opts(ns: str) -> K8sOptions:
    return with_trainer_images(K8sOptions(namespace=ns, s3_secret="minio", trainer_cpu="2", trainer_memory="1Gi"), "paddle")


def token_client(plane, token: str, host: str | None = None) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = host or plane.state.apiserver
    cfg.ssl_ca_cert = str(plane.ca)
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    cfg.retries = False
    return client.ApiClient(cfg)


def sa_token(kube, ns: str, sa: str) -> str:
    req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))
    return client.CoreV1Api(kube).create_namespaced_service_account_token(sa, ns, req).status.token


def until(pred, timeout: float = 20.0):
    return wait_for(pred, timeout, "condition", every=0.05)


def test_create_is_idempotent_and_keeps_labels_and_owner(kube, namespace):
    core = client.CoreV1Api(kube)
    owner_pod = core.create_namespaced_pod(namespace, restricted_pod("launcher", ["true"], image="not-pulled:1"))
    owner = {"name": "launcher", "uid": owner_pod.metadata.uid}
    kube_api = KubeApi(kube, namespace)
    svc = m.master_service(SPEC, opts(namespace), owner)
    created, fresh = kube_api.create(svc)
    assert fresh and created["metadata"]["uid"]
    again, fresh2 = kube_api.create(svc)  # a retried launcher adopts what exists (409 -> read)
    assert not fresh2 and again["metadata"]["uid"] == created["metadata"]["uid"]
    stored = core.read_namespaced_service("edl-mnist-master", namespace)
    assert stored.metadata.labels["edl.dev/role"] == "master"
    assert stored.metadata.owner_references[0].uid == owner_pod.metadata.uid
    assert [s["metadata"]["name"] for s in kube_api.list("services", "edl.dev/job=mnist")] == ["edl-mnist-master"]
    assert kube_api.delete("services", "edl-mnist-master") is True
    until(lambda: kube_api.get("services", "edl-mnist-master") is None)
    assert kube_api.delete("services", "edl-mnist-master") is False  # already gone: fine


def test_replace_with_a_stale_version_is_a_conflict(kube, namespace):
    kube_api = KubeApi(kube, namespace)
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "l", "namespace": namespace}, "spec": {"holderIdentity": "a"}}
    first, _ = kube_api.create(lease)
    first["spec"]["holderIdentity"] = "b"
    kube_api.replace(first)
    first["spec"]["holderIdentity"] = "c"  # still carries the old resourceVersion
    with pytest.raises(PermanentError, match="409"):
        kube_api.replace(first)


def test_wrong_token_forbidden_account_and_unreachable_api_are_reported_as_such(plane, kube, namespace):
    with pytest.raises(PermanentError, match="RBAC"):
        KubeApi(token_client(plane, "nope"), namespace).list("pods")  # 401
    default = token_client(plane, sa_token(kube, namespace, "default"))
    with pytest.raises(PermanentError, match="RBAC"):
        KubeApi(default, namespace).list("pods")  # 403: the default account may not
    launcher = token_client(plane, sa_token(kube, namespace, m.LAUNCHER_SA))
    assert KubeApi(launcher, namespace).list("pods") == []  # edl-launcher's Role may
    with pytest.raises(TemporaryError, match="unreachable"):
        KubeApi(token_client(plane, "x", host="https://127.0.0.1:1"), namespace).list("pods")


def summed_as_listed(ledger: PodLedger, pods: Informer) -> bool:
    """The ledger the informer kept as events came is the one its pods give, summed afresh."""
    fresh = PodLedger()
    for p in pods.values():
        fresh.put(p.name, p)
    a, b = ledger.totals(), fresh.totals()
    def key(t):
        return (t.load, t.requested, sorted(p.name for p in t.waiting),
                {j: sorted(p.name for p in ps) for j, ps in t.trainers.items()}, t.shapes)
    return key(a) == key(b)


def test_informers_follow_the_real_watch_and_relist_only_after_410(kube, namespace, runtime_image):
    kube_api = KubeApi(kube, namespace)
    core = client.CoreV1Api(kube)
    n_nodes = len(core.list_node().items)
    nodes = Informer("nodes", kube_api.list_watch("nodes"), decode_node, page=1, watch_timeout_s=1).start()
    ledger = PodLedger()
    pods = Informer("pods", kube_api.list_watch("pods", all_namespaces=True), decode_pod, watch_timeout_s=1,
                    index=ledger).start()
    key = f"{namespace}/edl-mnist-trainer-a"
    node_name = core.list_node().items[0].metadata.name
    try:
        assert nodes.wait_synced(10) and pods.wait_synced(10)
        assert len(nodes.values()) == n_nodes and nodes.lists == 1  # one page per node, one list
        kube_api.create(m.token_secret(SPEC, opts(namespace), "t"))
        trainer = m.trainer_pod(SPEC, opts(namespace), "edl-mnist-trainer-a")
        trainer["spec"]["containers"][0]["command"] = ["sleep", "60"]  # stays Running
        trainer["spec"]["containers"][0]["args"] = []
        trainer["spec"]["containers"][0]["image"] = runtime_image
        kube_api.create(trainer)
        until(lambda: pods.get(key) is not None)
        p = pods.get(key)
        assert (p.job, p.role, p.requests.cpu, p.requests.memory) == (f"{namespace}/mnist", "trainer", 2.0, 1.0)
        until(lambda: pods.get(key).phase is PodPhase.RUNNING)  # bound by the scheduler, run by the kubelet
        assert pods.get(key).node and pods.get(key).node.startswith("node-")
        until(lambda: summed_as_listed(ledger, pods))
        assert [p.name for p in ledger.totals().trainers[f"{namespace}/mnist"]] == [key]
        # Cordoning a node drops it from the schedulable set.
        core.patch_node(node_name, {"spec": {"unschedulable": True}})
        until(lambda: len(nodes.values()) == n_nodes - 1)
        core.patch_node(node_name, {"spec": {"unschedulable": False}})
        until(lambda: len(nodes.values()) == n_nodes)
        lists_before = pods.lists
        time.sleep(2.5)  # several watch rounds with nothing new: no re-list
        assert pods.lists == lists_before
        kube_api.delete("pods", "edl-mnist-trainer-a", grace_s=0)
        until(lambda: pods.get(key) is None)
        until(lambda: summed_as_listed(ledger, pods))
        assert f"{namespace}/mnist" not in ledger.totals().trainers
        pods.relist()  # a 410's list: the ledger is summed again from it
        until(lambda: summed_as_listed(ledger, pods))
        assert len(ledger) == sum(not p.phase.terminated for p in pods.values())
    finally:
        nodes.stop()
        pods.stop()
        core.patch_node(node_name, {"spec": {"unschedulable": False}})


def test_a_watch_from_a_compacted_version_gets_410_and_lists_again(plane, kube, namespace):
    kube_api = KubeApi(kube, namespace)
    inf = Informer("leases", kube_api.list_watch("leases"), lambda o: o, watch_timeout_s=1)
    inf.relist()
    assert inf.lists == 1
    kube_api.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": "x", "namespace": namespace}, "spec": {}})
    for i in range(5):  # history the informer has not seen, then compacted away
        kube_api.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                         "metadata": {"name": f"y{i}", "namespace": namespace}, "spec": {}})
        kube_api.delete("leases", f"y{i}")
    plane.compact_etcd()
    plane.stop_apiserver()  # restarted (an upgrade): its watch cache starts at the newest version
    plane.start_apiserver()
    inf.sync_step()  # the real apiserver answers 410 Expired (too old resource version)
    assert inf._state.resource_version is None
    inf.sync_step()  # so it lists again, then watches
    assert inf.lists == 2 and [o["metadata"]["name"] for o in inf.values()] == ["x"]


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


def test_every_rendered_object_is_accepted_by_the_real_apiserver(kube, namespace):
    """``edl k8s render``'s objects through validation and admission (PodSecurity restricted), dry run."""
    from kubernetes import dynamic

    dyn = dynamic.DynamicClient(kube)
    for file, objects in m.render(SPEC, opts(namespace)).items():
        if file == "00-rbac.yaml":
            continue  # created for real in every test namespace (the fixture), so accepted already
        for obj in objects:
            res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            ns = namespace if res.namespaced else None
            dyn.create(res, body=obj, namespace=ns, query_params=[("dryRun", "All")])


def test_the_plane_enforces_owner_reference_permissions_and_edl_s_objects_pass(plane, kube, namespace):
    """OwnerReferencesPermissionEnforcement (on in the plane, as on hardened clusters): the launcher may
    not set blockOwnerDeletion on an owner whose finalizers it cannot update; edl's own objects do not ask."""
    core = client.CoreV1Api(kube)
    owner_pod = core.create_namespaced_pod(namespace, restricted_pod("owner", ["true"], image="not-pulled:1"))
    owner = {"name": "owner", "uid": owner_pod.metadata.uid}
    launcher = KubeApi(token_client(plane, sa_token(kube, namespace, m.LAUNCHER_SA)), namespace)
    svc = m.master_service(SPEC, opts(namespace), owner)
    blocking = {**svc, "metadata": {**svc["metadata"], "name": "blocking", "ownerReferences": [
        {**svc["metadata"]["ownerReferences"][0], "blockOwnerDeletion": True}]}}
    with pytest.raises(PermanentError, match="403|refused|Forbidden"):
        launcher.create(blocking)
    created, fresh = launcher.create(svc)
    assert fresh and created["metadata"]["ownerReferences"][0]["uid"] == owner["uid"]


def test_one_sidecar_of_a_namespace_decides_and_another_takes_over(kube, namespace, plane):
    """Sidecars' views elect one through the autoscaler Lease on the real apiserver: it lists the cluster and
    publishes the plan; another reads its line; a stopped one hands on, a silent one lapses."""
    kube_api = KubeApi(kube, namespace)
    # A pod that stays Pending (no node has the label), for the leader's pod cache to show.
    kube_api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waiting"},
                     "spec": {"nodeSelector": {"edl.test/none": "x"},
                              "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                              "containers": [{"name": "c", "image": "none", "securityContext": {
                                  "allowPrivilegeEscalation": False, "runAsUser": 10001,
                                  "capabilities": {"drop": ["ALL"]}}}]}})
    views = {j: KubeClusterView(kube_api, j, f"pod-{j}", lease_duration_s=2, watch_timeout_s=1) for j in "abc"}
    a, b, c = views["a"], views["b"], views["c"]

    def period(view: KubeClusterView) -> bool:
        """One period of a sidecar's view: read the autoscaler Lease, then whether it decides."""
        now = time.time()
        view.refresh(now)
        return view.healthy() and view.lead(now)

    try:
        until(lambda: period(a))  # a takes the Lease and lists nodes, pods and demands
        until(lambda: any(p.name == f"{namespace}/waiting" for p in a.pods()))
        assert a.leading and a.nodes()
        assert not period(b) and not b.leading and not b._caches_started  # b reads the Lease alone
        line = PlanLine(3, ("node-0",), SizeReason(SizeCause.GROWING, "growing 1 -> 3: there is room for it"))
        a.publish_plan({f"{namespace}/b": line}, time.time())
        period(b)
        assert b.plan_line(f"{namespace}/b", time.time()) == line and b.plan_line(f"{namespace}/x", time.time()) is None
        a.stop()  # a's job ends: it hands the namespace on
        until(lambda: period(b))
        assert b.leading and b.nodes() and b.plan_line(f"{namespace}/b", time.time()) is None  # no plan yet
        # b goes silent (its pod is gone): after the Lease's 2 s, c takes over
        until(lambda: period(c), timeout=30)
        assert not period(b) and not b.leading and not b._caches_started
        # The API away: the view is not current, and nobody decides.
        away = KubeClusterView(KubeApi(token_client(plane, "x", host="https://127.0.0.1:1"), namespace, give_up_s=0.5),
                               "d", "pod-d", lease_duration_s=2)
        away.refresh(time.time())
        assert not away.healthy()
    finally:
        for v in views.values():
            v.stop()
        kube_api.delete("leases", autoscaler_lease.LEASE_NAME)
        kube_api.delete("pods", "waiting", grace_s=0)
