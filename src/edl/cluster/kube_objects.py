"""Kubernetes API objects (plain dicts, as the API edge returns them) read as edl's types: a pod's
phase, requests and exit, why it cannot start, a node's capacity and readiness. Pure functions, no
client: the launcher, the cluster backend, the sidecar's view and the benchmarks decode with them.

They keep only the fields the policy needs, so the sidecar's cache of a 5,000-node, 150,000-pod
cluster fits in well under 1 GiB. Quantities are read with the Kubernetes client's own parser.
"""

from __future__ import annotations

from typing import Any

from kubernetes.utils.quantity import parse_quantity

from edl.api.cluster import Node, Pod, PodPhase, Resources, TrainerExit
from edl.console import clip

GIB = float(2 ** 30)
GPU_KEY = "nvidia.com/gpu"


def quantity(value: Any) -> float:
    return float(parse_quantity(value)) if value is not None else 0.0


def _requests(spec: dict) -> Resources:
    """A pod's effective request: the sum over its containers, at least its largest init container."""
    def of(c: dict) -> tuple[float, float, float]:
        r = (c.get("resources") or {}).get("requests") or {}
        return quantity(r.get("cpu")), quantity(r.get("memory")) / GIB, quantity(r.get(GPU_KEY))

    cs = [of(c) for c in spec.get("containers") or []]
    total = [sum(x[i] for x in cs) for i in range(3)]
    for ic in (of(c) for c in spec.get("initContainers") or []):
        total = [max(total[i], ic[i]) for i in range(3)]
    overhead = spec.get("overhead") or {}
    return Resources(total[0] + quantity(overhead.get("cpu")), total[1] + quantity(overhead.get("memory")) / GIB,
                     total[2])


_PHASES: dict[str | None, PodPhase] = {"Pending": PodPhase.PENDING, "Running": PodPhase.RUNNING, "Succeeded": PodPhase.SUCCEEDED,
           "Failed": PodPhase.FAILED, "Unknown": PodPhase.RUNNING}  # Unknown: still holds its node


def pod_phase(obj: dict) -> PodPhase:
    """A pod's phase as edl counts it; one without a status yet is pending. A pod being deleted
    keeps its phase until it is gone: it holds its node until then."""
    return _PHASES.get((obj.get("status") or {}).get("phase"), PodPhase.PENDING)


def trainer_exit(pod: dict) -> tuple[TrainerExit, str]:
    """Why a terminated trainer pod ended, from its status (evicted, OOMKilled, exit code...)."""
    status = pod.get("status") or {}
    name = pod["metadata"]["name"]
    if status.get("reason") == "Evicted":
        return TrainerExit.PREEMPTED, f"evicted: {status.get('message', '')}".strip()
    if status.get("reason") == "NodeLost":
        return TrainerExit.NODE_LOST, "its node was lost"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return TrainerExit.PREEMPTED, f"{cond.get('reason', 'disrupted')}: {cond.get('message', '')}".strip()
    term = None
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if term:
            break
    if not term:
        if pod_phase(pod) is PodPhase.SUCCEEDED:
            return TrainerExit.SUCCEEDED, ""
        return TrainerExit.FAILED, status.get("message") or "failed without a container exit"
    code, reason = int(term.get("exitCode", 1)), term.get("reason", "")
    text = (term.get("message") or "").strip().splitlines()
    last = text[-1] if text else ""
    if code == 0:
        return TrainerExit.SUCCEEDED, ""
    if reason == "OOMKilled":
        limit = ""
        for c in (pod.get("spec") or {}).get("containers") or []:
            limit = ((c.get("resources") or {}).get("limits") or {}).get("memory", limit)
        return TrainerExit.OOM_KILLED, (f"trainer {name} was OOMKilled: its memory limit {limit or '(none)'} is too "
                                        "small for this model and batch size; raise --trainer-memory")
    if code == 2:
        return TrainerExit.USER_ERROR, last.removeprefix("edl: error: ") or f"trainer {name} refused the job"
    if code in (137, 143):  # killed from outside without OOM: the node or the scheduler took it back
        return TrainerExit.PREEMPTED, f"killed by the system (exit {code})"
    return TrainerExit.FAILED, f"exit code {code}{' (' + reason + ')' if reason else ''}: {clip(last)}"


# Waiting reasons that do not cure themselves: the image is not there, the container cannot be configured.
# ErrImagePull is the first failed pull, which the kubelet retries (a registry hiccup); the back-off
# after it means the retry failed too.
_PULL_FAILURES = ("ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
_CONFIG_FAILURES = ("CreateContainerConfigError",)


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:300] if lines else ""


def cannot_start(pod: dict) -> str | None:
    """Why one of a pod's containers can never start, one line naming the image or the missing
    Secret or key (the kubelet's message says which); ``None`` while it may still start."""
    status, name = pod.get("status") or {}, pod["metadata"]["name"]
    spec = pod.get("spec") or {}
    images = {c.get("name"): c.get("image") for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])}
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason, detail = waiting.get("reason"), _first_line(waiting.get("message"))
        if reason in _PULL_FAILURES:
            image = images.get(cs.get("name")) or cs.get("image")
            return f"pod {name}: image {image!r} cannot be pulled ({reason}{': ' + detail if detail else ''})"
        if reason in _CONFIG_FAILURES:
            return f"pod {name}: container {cs.get('name')} cannot be configured: {detail or reason}"
    return None


def last_exit(pod: dict, container: str) -> tuple[int, str, int] | None:
    """A container's latest exit: (exit code, last line of its message, restartCount). From
    ``state`` while it is terminated, else ``lastState``: a container that restarts (the master's
    ``restartPolicy: Always``) keeps its previous exit there. ``None`` if it never exited."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != container:
            continue
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if not term:
            return None
        lines = (term.get("message") or "").strip().splitlines()
        return int(term.get("exitCode", 1)), (lines[-1] if lines else "")[:300], int(cs.get("restartCount") or 0)
    return None


def decode_pod(obj: dict) -> Pod:
    meta, spec = obj["metadata"], obj.get("spec") or {}
    labels = meta.get("labels") or {}
    job = labels.get("edl.dev/job")
    role = labels.get("edl.dev/role")
    ns = meta.get("namespace", "")
    node = spec.get("nodeName")
    return Pod(name=f"{ns}/{meta['name']}", requests=_requests(spec), phase=pod_phase(obj),
               priority=int(spec.get("priority") or 0), node=node,
               job=f"{ns}/{job}" if job else None,
               role="trainer" if role == "trainer" else ("fixed" if job else "other"),
               nominated=None if node else (obj.get("status") or {}).get("nominatedNodeName") or None)


def decode_node(obj: dict) -> Node | None:
    """A node the scheduler may place pods on; ``None`` if cordoned or not Ready."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if spec.get("unschedulable"):
        return None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") != "True":
            return None
    a = status.get("allocatable") or {}
    labels = tuple(sorted((obj["metadata"].get("labels") or {}).items()))
    taints = tuple((t.get("key", ""), t.get("value") or "", t.get("effect", "")) for t in spec.get("taints") or ())
    return Node(obj["metadata"]["name"], Resources(quantity(a.get("cpu")), quantity(a.get("memory")) / GIB,
                                                   quantity(a.get(GPU_KEY))), labels, taints)


def pod_ready(pod: dict) -> bool:
    """The pod's Ready condition is True (its containers run and pass their readiness probes)."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def node_ready(obj: dict | None) -> str:
    """A node's Ready condition: "True", "False" or "Unknown" (also while it reports none yet);
    ``"gone"`` when there is no such Node."""
    if obj is None:
        return "gone"
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status") or "Unknown")
    return "Unknown"
