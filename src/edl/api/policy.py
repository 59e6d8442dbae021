"""The scaling policy interface: ``decide(snapshot) -> {job: target trainers}``.

Policies are pure and deterministic: the same snapshot gives the same plan, so
the sidecars of different jobs agree without a central controller, and the
simulator runs exactly the code the sidecar runs.
"""

from __future__ import annotations

from typing import Protocol

from edl.api.cluster import Snapshot


class Policy(Protocol):
    name: str

    def decide(self, snapshot: Snapshot) -> dict[str, int]:
        """Target trainer count for every job in ``snapshot.jobs``, each within its min..max."""
        ...

    def remaining_key(self, jobs: tuple) -> tuple:
        """What the decision reads of the jobs' remaining work (it changes every instant; the
        plan does not, unless this key does). Lets a caller skip a decision that cannot differ."""
        ...
