"""``KubeCluster``: the launcher's ``Cluster`` on Kubernetes.

Objects come from ``manifests`` (the same builders ``edl k8s render`` writes),
owned by the launcher pod so that they are garbage-collected with the workflow
step. Names are deterministic from the job name: a retried step finds the token
Secret, Service and master pod it created before and adopts them.
"""

from __future__ import annotations

import base64
import logging
import secrets
import time
import uuid
from dataclasses import replace
from datetime import datetime, timezone
from typing import Callable

from edl.cluster import manifests as m
from edl.api.cluster import MasterEndpoint, PodPhase, TrainerExit, TrainerPod
from edl.cluster.kube_api import KubeApi
from edl.cluster.kube_objects import cannot_start, last_exit, node_ready, pod_phase, pod_ready, trainer_exit
from edl.cluster.node_loss import judge_nodes
from edl.errors import EdlError, KubeForbiddenError, KubeNotFoundError, PermanentError, TemporaryError, UserError
from edl.api.spec import JobSpec, K8sOptions
from edl.masterlink import HttpMaster
from edl.storage.claim import FENCE_S

log = logging.getLogger("edl.launcher")
# In-place restarts of the master container (CrashLoopBackOff: 10, 20, 40 s apart) before the job fails.
MASTER_CRASH_LIMIT = 3
MASTER_GRACE_S = 30.0  # the master pod's terminationGracePeriodSeconds (the default: its spec sets none)
MASTER_GONE_MARGIN_S = 30.0  # beyond the grace: the kubelet's final delete, the API's answers
# The spare master pod: created this long after each master (its start does not compete with the master's
# and the trainers'), then looked at this often (one read) and made again when it is gone.
STANDBY_AFTER_S = 5.0
STANDBY_CHECK_S = 5.0


def _timestamp(s: str | None) -> float:
    if not s:
        return time.time()
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def _terminated_now(pod: dict, container: str) -> bool:
    return any(cs.get("name") == container and (cs.get("state") or {}).get("terminated")
               for cs in (pod.get("status") or {}).get("containerStatuses") or [])


def wake_over_http(address: str, token: str, await_handover_s: float) -> None:
    """Wake the spare master pod at ``address`` (``edl master --standby http``), one attempt."""
    HttpMaster(address, token, timeout_s=2.0, give_up_s=0.0, name=f"standby master at {address}").wake_standby(
        await_handover_s)


def _master_state(pod: dict) -> str | None:
    """The master pod's ``edl.dev/master`` label: serving, standby or retired."""
    return (pod["metadata"].get("labels") or {}).get(m.MASTER_STATE_LABEL)


def _restarts(pod: dict) -> int:
    """How often the pod's master container was restarted in place."""
    return next((int(cs.get("restartCount") or 0) for cs in (pod.get("status") or {}).get("containerStatuses") or []
                 if cs.get("name") == "master"), 0)


def _master_args(pod: dict) -> list[str]:
    return next((c.get("args") or [] for c in (pod.get("spec") or {}).get("containers") or []
                 if c.get("name") == "master"), [])


def _now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeCluster:
    def __init__(self, kube: KubeApi, spec: JobSpec, opts: K8sOptions, owner: dict | None = None,
                 master_via: str = "service", clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 place_master: Callable[[dict], str | None] | None = None,
                 wake_spare: Callable[[str, str, float], None] = wake_over_http) -> None:
        self.kube = kube
        self.wake_spare = wake_spare  # (address, token, seconds to wait for the predecessor's lock)
        # The plan's node for the master pod about to be created (its manifest in, a node name or
        # ``None`` out): the pod prefers it, as trainers prefer theirs.
        self.place_master = place_master
        self.clock = clock
        self.sleep = sleep
        self.spec = spec
        self.opts = opts
        self.owner = owner  # {"name", "uid"} of the launcher pod, from the downward API
        self.master_via = master_via  # "service" in the cluster; "pod-ip" from outside its DNS
        self.names = m.names(spec.job)
        self.trainer_prefix = self.names["trainer_prefix"]
        self.selector = f"edl.dev/job={spec.job}"
        self.not_ready_since: dict[str, float] = {}  # node -> first seen not Ready, on self.clock
        self.lost_pods: set[str] = set()  # pods reported lost with their node: deleted by force
        self.nodes_readable = True  # False once the API refused to show nodes (RBAC without it)
        self.token = ""  # the job's, once ensure_job read it: the spare master is woken with it
        # The serving master pod's name; its spare (``edl master --standby http``) waits under the other one.
        self.serving = self.names["master"]
        self.spare_due: float | None = None  # on self.clock: when to look at the spare (make it) next
        # The serving pod's restarts when it was woken, where it was a spare: its container restarted in place
        # since (it crashed) runs ``--standby http`` again, and is woken again.
        self.woken_restarts: int | None = None

    # ------------------------------------------------------------ Cluster
    def ensure_job(self) -> MasterEndpoint:
        secret, created = self.kube.create(m.token_secret(self.spec, self.opts, secrets.token_urlsafe(32), self.owner))
        token = self.token = base64.b64decode((secret.get("data") or {})["token"]).decode()
        service, _ = self.kube.create(m.master_service(self.spec, self.opts, self.owner))
        adopted = not created
        if adopted:
            self._adopt_masters(service)
        pod = self.kube.get("pods", self.serving)
        address = self.recreate_master() if pod is None or pod_phase(pod).terminated else None
        self.spare_due = self.clock() + STANDBY_AFTER_S
        if adopted:
            self.reown()
        self.record("JobAdopted" if adopted else "JobCreated",
                    f"job {self.spec.job}: {'adopted existing' if adopted else 'created'} token, service and master")
        return MasterEndpoint(address or self._master_address(), token, adopted)

    def reown(self) -> None:
        """A retried step is a new pod: the job it adopts still names the first step's pod as its
        owner, and the garbage collector would delete it with that pod. Point it at this one."""
        if self.owner is None:
            return
        refs = m.owner_references(self.owner)
        objects = [("pods", p) for p in self.kube.list("pods", self.selector)]
        objects += [(res, obj) for res, name in (("services", self.names["service"]), ("secrets", self.names["secret"]))
                    if (obj := self.kube.get(res, name)) is not None]
        moved = 0
        for res, obj in objects:
            current = [r.get("uid") for r in obj["metadata"].get("ownerReferences") or []]
            if current != [self.owner["uid"]]:
                # "add" sets the member whether or not it exists (RFC 6902).
                self.kube.patch(res, obj["metadata"]["name"], [{"op": "add", "path": "/metadata/ownerReferences",
                                                                "value": refs}])
                moved += 1
        if moved:
            log.info("re-owned %d objects of job %s to pod %s", moved, self.spec.job, self.owner["name"])

    @property
    def spare_name(self) -> str:
        """The name the serving master's spare has (or gets): the job's other master name."""
        first, second = self.names["master"], self.names["master_b"]
        return second if self.serving == first else first

    def _adopt_masters(self, service: dict) -> None:
        """A job made before this launcher: which of its master pods serves (labelled so). A spare labelled
        serving by a launcher that died before it woke it is woken now (a master that serves already
        refuses the call). A job from before spares (its Service selects any master pod) is moved to
        the serving one's selector."""
        masters = self.kube.list("pods", f"{self.selector},edl.dev/role=master")
        state = {p["metadata"]["name"]: _master_state(p) for p in masters}
        serving = [name for name, s in state.items() if s == m.SERVING]
        if serving:
            self.serving = sorted(serving)[0]
        elif self.names["master"] in state:
            self._label_master(self.names["master"], m.SERVING)
        selector = m.master_selector(self.spec.job)
        if (service.get("spec") or {}).get("selector") != selector:
            self.kube.patch("services", self.names["service"], [{"op": "replace", "path": "/spec/selector",
                                                                  "value": selector}])
        pod = next((p for p in masters if p["metadata"]["name"] == self.serving), None)
        if pod is not None and "--standby" in _master_args(pod) and (ip := (pod.get("status") or {}).get("podIP")):
            try:
                self.wake_spare(f"{ip}:{m.MASTER_PORT}", self.token, 0.0)
            except EdlError:
                pass  # it serves already (woken before), or it is not up: the rounds judge it as any master
            self.woken_restarts = _restarts(pod)

    def _label_master(self, name: str, state: str) -> bool:
        """Mark the master pod ``name`` serving, standby or retired; ``False`` when it is gone."""
        try:
            # RFC 6901: "/" in a key is written "~1".
            path = "/metadata/labels/" + m.MASTER_STATE_LABEL.replace("~", "~0").replace("/", "~1")
            self.kube.patch("pods", name, [{"op": "add", "path": path, "value": state}])
            return True
        except KubeNotFoundError:
            return False

    def _master_address(self, uid: str | None = None) -> str:
        """The Service's name; with ``pod-ip`` the master pod's IP (of the pod ``uid`` when given: a
        successor's, never the IP its predecessor had), once it has one."""
        if self.master_via == "pod-ip":
            deadline = self.clock() + 300
            while self.clock() < deadline:
                pod = self.kube.get("pods", self.serving) or {}
                ip = (pod.get("status") or {}).get("podIP")
                if ip and (uid is None or pod["metadata"]["uid"] == uid):
                    return f"{ip}:{m.MASTER_PORT}"
                if uid is not None and (pod.get("metadata") or {}).get("uid") != uid:
                    # Gone before it got an address (evicted from a node that went away meanwhile): the
                    # launcher's next round finds no master and creates another.
                    raise TemporaryError(f"master pod {self.serving} is gone before it got an address")
                self.sleep(0.2)
            raise UserError(f"master pod {self.serving} got no IP within 300 s")
        return m.master_address(self.spec.job, self.opts.namespace)

    def master_alive(self) -> bool:
        pod = self.kube.get("pods", self.serving)
        if pod is None:
            return False
        self._master_can_run(pod)
        node = (pod.get("spec") or {}).get("nodeName")
        if node and not pod_phase(pod).terminated and (status := self._lost_nodes({node}).get(node)):
            self._abandon_master(node, status)
            return False
        # A master that exited 0 is not restarted (restartPolicy OnFailure) even while its sidecar runs on.
        exited = last_exit(pod, "master")
        ended = exited is not None and exited[0] == 0 and _terminated_now(pod, "master")
        if pod_phase(pod).terminated or ended:
            return False
        if pod["metadata"].get("deletionTimestamp"):
            # Evicted from a node that is not Ready (the node lifecycle controller came before our own
            # --node-lost-timeout): nobody there confirms a graceful delete; a lost node's master.
            if node and (status := self._node_status(node)) not in (None, "True"):
                self._abandon_master(node, status)
                return False
            if self._ready_spare() is not None:
                return False  # being deleted (preempted, evicted, drained): its spare takes over now, not once it is gone
        self._wake_again(pod)
        self._keep_spare()
        return True

    def _wake_again(self, pod: dict) -> None:
        """A spare this launcher woke whose container has restarted since (it crashed) waits as a spare again:
        wake it, once it is up (its own earlier run is over: it takes the lock at once)."""
        if self.woken_restarts is None or _restarts(pod) <= self.woken_restarts or not pod_ready(pod):
            return
        try:
            self.wake_spare(f"{pod['status']['podIP']}:{m.MASTER_PORT}", self.token, 0.0)
        except EdlError:
            return  # not answering yet: next round
        self.woken_restarts = _restarts(pod)
        self.record("MasterWokenAgain", f"master {self.serving} restarted in place as a spare; woken again")

    def _ready_spare(self) -> dict | None:
        """The serving master's spare pod, if it is up and waiting to be woken (Ready, with an address)."""
        pod = self.kube.get("pods", self.spare_name)
        if pod is None or pod["metadata"].get("deletionTimestamp") or pod_phase(pod).terminated:
            return None
        if _master_state(pod) != m.STANDBY or not pod_ready(pod):
            return None
        return pod if (pod.get("status") or {}).get("podIP") else None

    def _keep_spare(self) -> None:
        """Once every ``STANDBY_CHECK_S``: the spare master pod waits under the other name, or is made
        (a spare that ended, or a master retired there, is deleted first: the name is free next time)."""
        if self.spare_due is None or self.clock() < self.spare_due:
            return
        self.spare_due = self.clock() + STANDBY_CHECK_S
        name = self.spare_name
        pod = self.kube.get("pods", name)
        if pod is None:
            self.kube.create(m.master_pod(self.spec, self.opts, self.owner, name=name, standby=True))
            return
        if pod["metadata"].get("deletionTimestamp"):
            return  # going: made again once it is gone
        if _master_state(pod) != m.STANDBY or pod_phase(pod).terminated:
            self.kube.delete("pods", name)

    def _promote_spare(self, spare: dict, old: dict | None) -> str:
        """The spare takes over from ``old`` (the serving master's pod, if it still exists): ``old`` is
        retired (the Service leaves it), the spare labelled serving and woken; ``old`` deleted if it was
        not being deleted already. A predecessor seen stopping hands the run lock over as it ends: the
        spare waits up to the fence for that instead of fencing it."""
        stopping = old is not None and bool(old["metadata"].get("deletionTimestamp"))
        name, old_name = spare["metadata"]["name"], self.serving
        if old is not None:
            self._label_master(old_name, m.RETIRED)
        # Serving before it is woken: a trainer that reaches it first is answered 503 and asks again.
        if not self._label_master(name, m.SERVING):
            raise TemporaryError(f"standby master {name} is gone")
        self.wake_spare(f"{spare['status']['podIP']}:{m.MASTER_PORT}", self.token, FENCE_S if stopping else 0.0)
        if old is not None and not stopping:
            self.kube.delete("pods", old_name)
        self.serving, self.woken_restarts = name, _restarts(spare)
        self.spare_due = self.clock() + STANDBY_AFTER_S
        self.record("MasterTakenOver", f"standby master {name} took over from {old_name}")
        return self._master_address(spare["metadata"]["uid"])

    def _abandon_master(self, node: str, status: str) -> None:
        """The master's node is lost: nobody there will confirm a graceful delete, so its pod goes
        by force (its name is free at once for the successor ``recreate_master`` creates)."""
        self.record("MasterNodeLost", f"master {self.serving}: its node {node} is not Ready ({status}) for "
                                      f"over {self.opts.node_lost_timeout_s:.0f} s; deleting it by force",
                    warning=True)
        self.kube.delete("pods", self.serving, grace_s=0)

    def _lost_nodes(self, nodes: set[str]) -> dict[str, str]:
        """Of ``nodes``, those lost (``judge_nodes``), each with its Ready status."""
        if not nodes or not self.nodes_readable:
            return {}
        ready = {}
        for node in sorted(nodes):
            if (status := self._node_status(node)) is None:
                return {}
            ready[node] = status
        verdict = judge_nodes(ready, self.not_ready_since, self.clock(), self.opts.node_lost_timeout_s)
        self.not_ready_since = verdict.not_ready_since
        return verdict.lost

    def _node_status(self, node: str) -> str | None:
        """The node's Ready status (``node_ready``); ``None`` where nodes cannot be read (said once)."""
        if not self.nodes_readable:
            return None
        try:
            return node_ready(self.kube.get("nodes", node))
        except KubeForbiddenError as e:
            self.nodes_readable = False
            self.record("NodesUnreadable", f"cannot read nodes ({str(e).splitlines()[0]}): a lost node is "
                                           "noticed only once Kubernetes removes its pods", warning=True)
            return None

    def _master_can_run(self, pod: dict) -> None:
        """Raise with the master's own reason when waiting for it cannot help: it refused the job
        (exit 2, now or before its last restart), it cannot start, or it keeps crashing."""
        why = cannot_start(pod)
        if why is not None:
            raise PermanentError(f"master of job {self.spec.job} cannot start: {why}")
        exited = last_exit(pod, "master")
        if exited is None:
            return
        code, line, restarts = exited
        if code == 2:
            raise UserError(line.removeprefix("edl: error: ") or "the master refused the job")
        if code != 0 and restarts >= MASTER_CRASH_LIMIT:
            raise PermanentError(f"master of job {self.spec.job} keeps crashing ({restarts} restarts); "
                                 f"last exit {code}: {line}")

    def recreate_master(self) -> str:
        """Replace the master: its spare takes over where one waits (``_promote_spare``); else a graceful
        delete (the old master takes its grace period, its last writes end), then the successor under
        the same name once the old one is gone, never beside it. Returns the successor's address (with
        ``pod-ip``, its own IP, once it has one)."""
        name = self.serving
        pod = self.kube.get("pods", name)
        if pod is not None:
            self._master_can_run(pod)
        if (spare := self._ready_spare()) is not None:
            try:
                return self._promote_spare(spare, pod)
            except EdlError as e:
                self.record("StandbyUnusable", f"standby master {spare['metadata']['name']} could not take over "
                                               f"({str(e).splitlines()[0]}); starting a new master", warning=True)
                self.kube.delete("pods", spare["metadata"]["name"], grace_s=0)
                pod = self.kube.get("pods", name)
        if pod is not None:
            old_uid = pod["metadata"]["uid"]
            self.kube.delete("pods", name)
            self._wait_gone(old_uid)
        else:
            old_uid = None
        node = None if self.place_master is None else self.place_master(m.master_pod(self.spec, self.opts, name=name))
        created, _ = self.kube.create(m.master_pod(self.spec, self.opts, self.owner, node, name=name))
        self.spare_due, self.woken_restarts = self.clock() + STANDBY_AFTER_S, None
        if old_uid is not None and created["metadata"]["uid"] == old_uid:
            # A 409 that handed back the dying pod (it cannot, after _wait_gone; never adopt it).
            raise TemporaryError(f"master pod {name} is still being deleted")
        return self._master_address(created["metadata"]["uid"])

    def _wait_gone(self, uid: str) -> None:
        """Until the pod ``uid`` is gone (404, or another pod under its name). Bounded by its grace
        period and a margin; the API away meanwhile is waited out within that bound. Past it:
        ``TemporaryError``, and the launcher holds and asks again next round."""
        name = self.serving
        deadline = self.clock() + MASTER_GRACE_S + MASTER_GONE_MARGIN_S
        while True:
            try:
                pod = self.kube.get("pods", name)
                if pod is None or pod["metadata"]["uid"] != uid:
                    return
            except TemporaryError:
                pass  # the API is away: it answers again, or the deadline ends the wait
            if self.clock() >= deadline:
                raise TemporaryError(f"master pod {name} still terminating after "
                                     f"{MASTER_GRACE_S + MASTER_GONE_MARGIN_S:.0f} s")
            self.sleep(0.5)

    def trainers(self) -> list[TrainerPod]:
        out = []
        for pod in self.kube.list("pods", f"{self.selector},edl.dev/role=trainer"):
            meta, phase = pod["metadata"], pod_phase(pod)
            exit_, message = trainer_exit(pod) if phase.terminated else (None, "")
            if exit_ is None and (why := cannot_start(pod)) is not None:
                exit_, message = TrainerExit.CANNOT_START, f"trainer {why}"
            out.append(TrainerPod(meta["name"], phase, _timestamp(meta.get("creationTimestamp")),
                                  (pod.get("spec") or {}).get("nodeName"), exit_, message,
                                  m.preferred_node(pod.get("spec") or {})))
        lost = self._lost_nodes({t.node for t in out if t.node and not t.phase.terminated})
        for i, t in enumerate(out):
            if t.node in lost and not t.phase.terminated:
                # Its pod may look Running (or Terminating) for ever: it has ended as far as the job goes.
                self.lost_pods.add(t.name)
                out[i] = replace(t, phase=PodPhase.FAILED, exit=TrainerExit.NODE_LOST,
                                 message=f"its node {t.node} is not Ready ({lost[t.node]}) for over "
                                         f"{self.opts.node_lost_timeout_s:.0f} s")
        return out

    def create_trainer(self, name: str, node: str | None = None) -> None:
        self.kube.create(m.trainer_pod(self.spec, self.opts, name, self.owner, node))

    def delete_trainer(self, name: str) -> None:
        # On a lost node a graceful delete never completes: nobody there confirms it.
        self.kube.delete("pods", name, grace_s=0 if name in self.lost_pods else None)
        self.lost_pods.discard(name)

    def delete_job(self) -> None:
        for pod in self.kube.list("pods", self.selector):
            self.kube.delete("pods", pod["metadata"]["name"], grace_s=0)
        self.kube.delete("services", self.names["service"])
        self.kube.delete("leases", self.names["lease"])
        self.kube.delete("secrets", self.names["secret"])

    def record(self, reason: str, message: str, warning: bool = False) -> None:
        log.log(logging.WARNING if warning else logging.INFO, "%s: %s", reason, message)
        if self.owner is None:
            return
        now = _now_rfc3339()
        try:
            self.kube.create({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{self.owner['name']}.{uuid.uuid4().hex[:16]}", "namespace": self.opts.namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": self.owner["name"],
                                   "namespace": self.opts.namespace, "uid": self.owner["uid"]},
                "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
                "source": {"component": "edl-launcher"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            })
        except Exception as e:  # noqa: BLE001 - an event that cannot be written must not stop the job
            log.debug("event %s not written: %s", reason, e)
