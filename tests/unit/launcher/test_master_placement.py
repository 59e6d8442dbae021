"""The launcher asks the plan where its master pod goes before it creates it (``master_placer``)."""

from __future__ import annotations

from edl.api.spec import JobSpec, K8sOptions
from edl.cluster import manifests as m
from edl.errors import KubeForbiddenError
from edl.launcher.kube import master_placer

SPEC = JobSpec(job="mnist", model_def="m", data="s3://d/x", epochs=1, batch_size=1, min_trainers=1,
               max_trainers=2, trainers=1, checkpoint_uri="s3://c/mnist")
OPTS = K8sOptions(namespace="ml")  # trainers of 2 cores


class Source:
    def __init__(self, items: list[dict], refuse: bool = False) -> None:
        self.items, self.refuse = items, refuse

    def page(self, selector, limit, token) -> dict:
        if self.refuse:
            raise KubeForbiddenError("Kubernetes API: list pods: HTTP 403 Forbidden")
        return {"items": self.items, "metadata": {"resourceVersion": "1"}}


class ListingKube:
    """One list of each resource, as ``KubeClusterView.list_once`` reads it."""

    namespace = "ml"

    def __init__(self, nodes: list[dict], pods: list[dict], refuse_pods: bool = False) -> None:
        self.lists = {"nodes": Source(nodes), "pods": Source(pods, refuse_pods), "leases": Source([])}

    def list_watch(self, resource: str, all_namespaces: bool = False) -> Source:
        return self.lists[resource]


def node(name: str, cpu: str) -> dict:
    return {"metadata": {"name": name}, "spec": {},
            "status": {"allocatable": {"cpu": cpu, "memory": "64Gi"}, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_the_master_goes_where_it_leaves_room_for_trainers_not_where_the_spread_would_put_it():
    # The master takes 0.75 cores: on the 3-core node 2.25 are left (one 2-core trainer, 0.25 lost); on the
    # 8-core node 7.25 (three trainers, 1.25 lost). The default profile (LeastAllocated) would pick the 8-core.
    kube = ListingKube([node("small", "3"), node("big", "8")], [])
    assert master_placer(kube, SPEC, OPTS)(m.master_pod(SPEC, OPTS)) == "small"


def test_a_cluster_it_may_not_list_leaves_the_master_to_the_scheduler(caplog):
    kube = ListingKube([node("small", "3")], [], refuse_pods=True)
    assert master_placer(kube, SPEC, OPTS)(m.master_pod(SPEC, OPTS)) is None
    assert "placed by the scheduler alone" in caplog.text and "403" in caplog.text


def test_edl2017_places_no_master():
    from dataclasses import replace

    opts = replace(OPTS, sidecar_policy="edl2017")
    assert master_placer(ListingKube([node("small", "3")], []), SPEC, opts)(m.master_pod(SPEC, opts)) is None
