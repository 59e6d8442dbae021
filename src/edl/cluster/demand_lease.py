"""The sidecar's demand as a ``coordination.k8s.io/v1`` Lease: how jobs tell each other on
Kubernetes what they want, renewed every period so a dead sidecar stops counting."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

from edl.api.cluster import JobDemand, SizeReason, decode_demand, encode_demand

log = logging.getLogger("edl.sidecar")
DEMAND_ANNOTATION = "edl.dev/demand"
REASON_ANNOTATION = "edl.dev/size-reason"  # why the job is at its size: {"cause", "text"} as JSON


def renew_time(t: float) -> str:
    """A Lease's ``renewTime`` (RFC 3339, microseconds)."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lapsed(obj: dict, now: float) -> bool:
    """Whether a Lease's holder stopped renewing it (``leaseDurationSeconds`` passed), or it has no time."""
    spec = obj.get("spec") or {}
    if not spec.get("renewTime"):
        return True
    when = datetime.fromisoformat(spec["renewTime"].replace("Z", "+00:00")).timestamp()
    return now - when > float(spec.get("leaseDurationSeconds") or 0)


def demand_lease(d: JobDemand, name: str, namespace: str, holder: str, now: float, duration_s: int,
                 labels: dict[str, str], reason: SizeReason | None = None) -> dict:
    """A ``coordination.k8s.io/v1`` Lease that carries the demand, and why the job is at its size:
    renewed every period, so a sidecar that dies stops counting once ``leaseDurationSeconds`` pass."""
    annotations = {DEMAND_ANNOTATION: encode_demand(d)}
    if reason is not None:
        annotations[REASON_ANNOTATION] = json.dumps(reason.to_json(), separators=(",", ":"))
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration_s,
                     "renewTime": renew_time(now)}}


def demand_from_lease(obj: dict, now: float) -> JobDemand | None:
    """The demand a Lease carries, or ``None`` if it expired or is not ours to read."""
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(DEMAND_ANNOTATION)
    if not text:
        return None
    try:
        if lapsed(obj, now):
            return None  # its sidecar stopped renewing: the job is gone or stuck
        return decode_demand(text)
    except ValueError as e:
        log.warning("ignoring lease %s: %s", obj["metadata"].get("name"), e)
        return None
