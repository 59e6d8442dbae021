"""The informer applies watch events to its cache and its index, bookmarks included, and rides out a
lost API."""

from __future__ import annotations

import logging
import threading

from edl.api.cluster import Pod
from edl.api.ledger import PodLedger
from edl.cluster.informer import Informer
from edl.cluster.kube_objects import decode_pod
from edl.errors import KubeUnavailableError
from tests.waits import wait_for


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


class FlakySource(Source):
    """Its watch fails ``fails`` times, then streams nothing (a quiet namespace) until stopped."""

    def __init__(self, fails: int) -> None:
        super().__init__([])
        self.fails = fails
        self.pages = 0
        self.quiet = threading.Event()

    def page(self, selector, limit, token):
        self.pages += 1
        return super().page(selector, limit, token)

    def watch(self, selector, version, timeout_s):
        if self.fails:
            self.fails -= 1
            raise KubeUnavailableError("Kubernetes API unreachable: watch pods '': connection refused")
        self.quiet.set()
        return QuietStream()


class QuietStream:
    def __init__(self) -> None:
        self.stopped = threading.Event()

    def __iter__(self):
        self.stopped.wait(30)
        return iter(())

    def stop(self) -> None:
        self.stopped.set()


def test_a_lost_api_is_one_warning_then_a_fresh_list_and_one_line_when_it_answers(monkeypatch, caplog):
    monkeypatch.setattr(Informer, "BACKOFF_S", (0.01, 0.02))
    source = FlakySource(fails=3)
    inf: Informer[Pod] = Informer("pods", source, decode_pod)
    with caplog.at_level(logging.DEBUG, logger="edl.kubernetes"):
        inf.start()
        try:
            assert source.quiet.wait(10)
            assert wait_for(inf.healthy, 10, "the cache current again")  # listed again: no event needed
        finally:
            inf.stop(5)
    assert source.pages == 4  # the first list, and one after each failed watch
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert lines == [(logging.WARNING, "pods: Kubernetes API unreachable: watch pods '': connection refused; "
                                       "retrying with backoff"),
                     (logging.INFO, lines[1][1])] and lines[1][1].startswith("pods: the API answers again after")
