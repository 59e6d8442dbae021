"""When a node counts as lost, decided as a pure function of what the launcher saw and its clock.

A node that stops answering (frozen, cut off, powered down) keeps its pods in the API as they
were: Running, or Terminating once evicted, until someone force-deletes them; nobody on the
node will ever confirm their end. So a node whose Ready condition has not been ``True`` for
longer than a deadline, counted from when this launcher first saw it so on its own monotonic
clock (the apiserver's timestamps are on another clock), is lost, and so are its pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

GONE = "gone"  # the Node object no longer exists


@dataclass(frozen=True)
class NodeVerdict:
    not_ready_since: dict[str, float]  # node -> when first seen not Ready (the launcher's clock)
    lost: dict[str, str]  # node -> its Ready status ("False", "Unknown", "gone") for those past the deadline


def judge_nodes(ready: Mapping[str, str], not_ready_since: Mapping[str, float], now: float,
                timeout_s: float) -> NodeVerdict:
    """``ready``: the nodes seen this round, each with its Ready condition's status ("True",
    "False", "Unknown", or ``GONE``). Nodes not seen this round keep their clock; one seen Ready
    again starts afresh."""
    since = dict(not_ready_since)
    for node, status in ready.items():
        if status == "True":
            since.pop(node, None)
        else:
            since.setdefault(node, now)
    lost = {node: ready[node] for node in ready if node in since and now - since[node] >= timeout_s}
    return NodeVerdict(since, lost)
