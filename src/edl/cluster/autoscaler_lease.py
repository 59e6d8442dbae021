"""The namespace's autoscaler Lease: which job's sidecar decides for the namespace's jobs, and the
lines of its latest plan. Pure: the Lease as a dict, built and read.

One sidecar holds it (``holderIdentity``) and renews it every period, writing each job's line of its
plan into it; the others read their own line. A holder that stops renewing loses it once
``leaseDurationSeconds`` pass, and the next sidecar to find it lapsed takes it over.
"""

from __future__ import annotations

import json
import logging

from edl.api.cluster import PlanLine
from edl.cluster.demand_lease import lapsed, renew_time

log = logging.getLogger("edl.sidecar")
LEASE_NAME = "edl-autoscaler"
ROLE = "autoscaler"  # its edl.dev/role label: the followers watch this one Lease alone
PLAN_ANNOTATION = "edl.dev/plan"  # {"lines": {job: PlanLine}} as JSON


def autoscaler_lease(namespace: str, holder: str, now: float, duration_s: int, labels: dict[str, str],
                     lines: dict[str, PlanLine] | None = None) -> dict:
    annotations = {}
    if lines is not None:
        annotations[PLAN_ANNOTATION] = json.dumps({"lines": {j: line.to_json() for j, line in sorted(lines.items())}},
                                                  separators=(",", ":"))
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": LEASE_NAME, "namespace": namespace, "labels": labels, "annotations": annotations},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration_s, "renewTime": renew_time(now)}}


def holder_of(obj: dict | None, now: float) -> str | None:
    """Who holds the Lease now; ``None`` when nobody does (no Lease, or it lapsed)."""
    if obj is None or not (obj.get("spec") or {}).get("holderIdentity"):
        return None
    try:
        return None if lapsed(obj, now) else str(obj["spec"]["holderIdentity"])
    except ValueError:
        return None


def plan_lines(obj: dict | None, now: float) -> dict[str, PlanLine]:
    """The lines of the plan the Lease carries, while its holder renews it (else none)."""
    if obj is None or holder_of(obj, now) is None:
        return {}
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(PLAN_ANNOTATION)
    if not text:
        return {}
    try:
        return {j: PlanLine.from_json(d) for j, d in json.loads(text)["lines"].items()}
    except (ValueError, KeyError, TypeError) as e:
        log.warning("ignoring the plan on lease %s: %s", LEASE_NAME, e)
        return {}
