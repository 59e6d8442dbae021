"""The informer applies watch events to its cache and its index, bookmarks included."""

from __future__ import annotations

from edl.api.cluster import Pod
from edl.api.ledger import PodLedger
from edl.cluster.informer import Informer
from edl.cluster.kube_objects import decode_pod


def pod(name: str, node: str | None = "n0", rv: str = "2") -> dict:
    return {"metadata": {"name": name, "namespace": "ml", "resourceVersion": rv},
            "spec": {"nodeName": node, "containers": [{"resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Running"}}


class Source:
    """One page of pods, then one watch stream of ``events``."""

    def __init__(self, events: list[tuple[str, dict]]) -> None:
        self.events = events

    def page(self, selector, limit, token):
        return {"items": [pod("a", rv="1")], "metadata": {"resourceVersion": "1"}}

    def watch(self, selector, version, timeout_s):
        return Stream(self.events)


class Stream(list):
    def stop(self) -> None:
        pass


def test_watch_events_reach_the_cache_and_its_ledger_and_a_bookmark_only_moves_the_version():
    ledger = PodLedger()
    events = [("ADDED", pod("b", rv="3")), ("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "4"}}),
              ("MODIFIED", pod("b", node="n1", rv="5")), ("DELETED", pod("a", rv="6"))]
    inf: Informer[Pod] = Informer("pods", Source(events), decode_pod, index=ledger)
    inf.relist()
    assert len(ledger) == 1
    inf.watch_once()
    assert [p.name for p in inf.values()] == ["ml/b"] and inf.get("ml/b").node == "n1"
    assert inf._state.resource_version == "6" and ledger.totals().load == {"n1": (1000, 0, 0)}
