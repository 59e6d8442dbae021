"""The namespace's autoscaler Lease: which job's sidecar decides for the namespace's jobs, and the
lines of its latest plan. Pure: the Lease as a dict, built and read.

One sidecar holds it (``holderIdentity``) and renews it every period, writing each job's line of its
plan into it; the others read their own line. A holder that stops renewing loses it once
``leaseDurationSeconds`` pass, and the next sidecar to find it lapsed takes it over. The holder's pod
owns it, so it goes with that pod.
"""

from __future__ import annotations

import json
import logging
from collections import Counter

from edl.api.cluster import PlanLine, SizeReason
from edl.cluster.demand_lease import lapsed, renew_time

log = logging.getLogger("edl.sidecar")
LEASE_NAME = "edl-autoscaler"
ROLE = "autoscaler"  # its edl.dev/role label, apart from the demand Leases the deciding sidecar watches
PLAN_ANNOTATION = "edl.dev/plan"  # {"lines": {job: line}} as JSON
HOLDER_JOB_ANNOTATION = "edl.dev/holder-job"  # the job whose sidecar holds it, for people
# An object's annotations may take 256 KiB: past this, the lines go without their nodes (sizes and reasons
# only; the launchers then create trainers without preferred nodes).
PLAN_BYTES = 200_000


def _line(line: PlanLine, nodes: bool) -> dict:
    d: dict = {"size": line.size, "reason": line.reason.to_json(), "at": round(line.at, 3)}
    if nodes:
        d["nodes"] = sorted(Counter(line.nodes).items())  # [[node, trainers], ...]: one entry per node
    return d


def encode_plan(lines: dict[str, PlanLine]) -> str:
    """The plan's JSON for the Lease; without the nodes if it would not fit an object's annotations."""
    for nodes in (True, False):
        text = json.dumps({"lines": {j: _line(line, nodes) for j, line in sorted(lines.items())}},
                          separators=(",", ":"))
        if len(text) <= PLAN_BYTES:
            return text
        log.warning("the plan for %d jobs takes %d bytes: published without the trainers' nodes", len(lines), len(text))
    return text


def decode_line(d: dict) -> PlanLine:
    nodes = tuple(str(n) for n, k in d.get("nodes") or () for _ in range(int(k)))
    return PlanLine(int(d["size"]), nodes, SizeReason.from_json(d["reason"]), float(d.get("at") or 0.0))


def autoscaler_lease(namespace: str, holder: str, holder_job: str, now: float, duration_s: int,
                     labels: dict[str, str], lines: dict[str, PlanLine] | None = None) -> dict:
    annotations = {HOLDER_JOB_ANNOTATION: holder_job}
    if lines is not None:
        annotations[PLAN_ANNOTATION] = encode_plan(lines)
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


def _plan(obj: dict | None, now: float) -> dict[str, dict]:
    """The plan's lines as JSON, while the Lease's holder renews it (else none)."""
    if obj is None or holder_of(obj, now) is None:
        return {}
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(PLAN_ANNOTATION)
    if not text:
        return {}
    try:
        lines = json.loads(text)["lines"]
        if not isinstance(lines, dict):
            raise TypeError("lines is not an object")
        return lines
    except (ValueError, KeyError, TypeError) as e:
        log.warning("ignoring the plan on lease %s: %s", LEASE_NAME, e)
        return {}


def plan_lines(obj: dict | None, now: float) -> dict[str, PlanLine]:
    """The lines of the plan the Lease carries, while its holder renews it (else none)."""
    try:
        return {j: decode_line(d) for j, d in _plan(obj, now).items()}
    except (ValueError, KeyError, TypeError) as e:
        log.warning("ignoring the plan on lease %s: %s", LEASE_NAME, e)
        return {}


def plan_line(obj: dict | None, job: str, now: float) -> PlanLine | None:
    """``job``'s line of the plan the Lease carries (``plan_lines``), the others left undecoded: what a
    following sidecar reads every period."""
    d = _plan(obj, now).get(job)
    if d is None:
        return None
    try:
        return decode_line(d)
    except (ValueError, KeyError, TypeError) as e:
        log.warning("ignoring %s's line of the plan on lease %s: %s", job, LEASE_NAME, e)
        return None
