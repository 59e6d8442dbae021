"""The policy registry: every scaling policy by the name users give it (``--policy``)."""

from __future__ import annotations

from edl.api.policy import Policy
from edl.autoscale.edl2017 import Edl2017
from edl.autoscale.edl_policy import EdlPolicy
from edl.errors import UserError

POLICIES: dict[str, type] = {"edl": EdlPolicy, "edl2017": Edl2017}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)


def get_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise UserError(f"unknown policy {name!r}; choose one of: {', '.join(sorted(POLICIES))}")
    return POLICIES[name]()
