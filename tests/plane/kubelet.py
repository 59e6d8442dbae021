"""The loopback kubelet: one Node of the plane, written against the real API, running the
containers of the pods bound to it as local processes.

    python -m tests.plane.kubelet --node node-0 --kubeconfig node-0.kubeconfig ...

It acts as its node (a ``system:node:NAME`` client certificate, so the Node authorizer and
NodeRestriction admission apply) and does what a kubelet does, as far as edl's tests see it:

- registers its Node (capacity, allocatable, addresses, the port its log server listens on)
  and reports Ready; renews its Lease in ``kube-node-lease`` every second, so the node
  lifecycle controller sees it alive; a node that stops renewing (``SIGSTOP`` this process:
  ``ControlPlane.lose_node``) is marked Unknown, tainted and its pods evicted by the
  controllers, and stays Terminating as on a real cluster;
- pulls each container's image from a registry (``imagePullPolicy`` honoured, one pull at a
  time, in the background) and runs the container in its own mount and UTS namespaces (its
  hostname is the pod's name) on the image's root filesystem (``runtime.py``), with the
  image's Entrypoint, Cmd, Env, User and WorkingDir, as ``runAsUser``/``runAsGroup`` say
  (``runAsNonRoot`` checked), the root read-only for ``readOnlyRootFilesystem``; its
  volumes are bind-mounted at their paths (emptyDir, secret, configMap, projected: the
  ServiceAccount token from the TokenRequest API, the root CA, the namespace) and
  ``/etc/hosts`` resolves Service names; env from values, Secrets, ConfigMaps, the downward
  API and ``$(VAR)`` references;
- reports ``pods/status`` as a kubelet does: phase, conditions, podIP, containerStatuses with
  state, lastState, restartCount and waiting reasons (ErrImagePull/ImagePullBackOff for an
  image the registry does not have, CreateContainerConfigError for a missing Secret,
  ConfigMap or key, or a user that breaks ``runAsNonRoot``,
  CrashLoopBackOff with exponential back-off from 10 s to 300 s); restartPolicy honoured;
  readiness from httpGet/tcpSocket probes;
- graceful deletion: SIGTERM, the pod's grace period, SIGKILL, final status, then the final
  delete; OOMKilled (exit 137) when a container's processes pass its memory limit; eviction
  (phase Failed, reason Evicted) when an emptyDir passes its sizeLimit;
- serves container logs over HTTPS the way the apiserver proxies them (``kubectl logs``,
  ``read_namespaced_pod_log``: tailLines, previous, follow, limitBytes).

Where it departs from a real kubelet (none of this is something edl relies on):
- No network namespace: every pod gets its own address in 127.0.0.0/8 as ``status.podIP``,
  but processes share the machine's network, so a process that binds 0.0.0.0 or 127.0.0.1
  takes that port for every pod (edl binds its pod IP). Service names resolve (per-pod
  ``/etc/hosts``, refreshed every second; in place of CoreDNS, read with the plane's admin
  credentials) to the address of a Ready pod the Service selects, not to a ClusterIP: there
  is no kube-proxy, so a Service's port must equal its targetPort. ``KUBERNETES_SERVICE_HOST``
  is the apiserver's loopback address.
- No PID namespace, cgroups or seccomp (``runtime.py`` lists what a container does get): CPU
  limits are not enforced; memory is the sum of the container's processes' RSS, sampled twice
  a second. Only registries on loopback can be pulled from.
- Init containers run in order, but there are no sidecar-style init or
  ephemeral containers, lifecycle hooks, liveness or startup probes, exec probes, termination
  message files (only FallbackToLogsOnError), Service environment variables, or volume types
  other than the four above; tokens are not refreshed (they last an hour).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlparse

from kubernetes import config
from kubernetes.client.rest import ApiException
from kubernetes.utils.quantity import parse_quantity

from tests.plane import runtime

VERSION = "v1.37.2"
LEASE_S = 1.0  # how often the node's Lease is renewed
LEASE_DURATION_S = 6
NODE_STATUS_S = 10.0
TICK_S = 0.2
BACKOFF_START_S, BACKOFF_MAX_S, BACKOFF_RESET_S = 10.0, 300.0, 600.0
LOG_TAIL_LINES, LOG_TAIL_BYTES = 80, 2048  # the kubelet's FallbackToLogsOnError message
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a runtime's, where the image sets none


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ConfigError(Exception):
    """A container cannot be configured (CreateContainerConfigError)."""


class MountError(Exception):
    """A volume cannot be set up (the container waits in ContainerCreating)."""


# ---------------------------------------------------------------- the API, as plain dicts
class Api:
    """REST calls as the kubeconfig's identity, through the kubernetes client's transport."""

    def __init__(self, kubeconfig: str) -> None:
        self.client = config.new_client_from_config(config_file=kubeconfig)
        self.host = self.client.configuration.host

    def call(self, method: str, path: str, body=None, query: dict | None = None,
             content_type: str = "application/json", timeout: float = 10) -> dict | None:
        url = self.host + path + ("?" + "&".join(f"{k}={quote(str(v))}" for k, v in query.items()) if query else "")
        headers = {"Accept": "application/json", "Content-Type": content_type}
        resp = self.client.rest_client.request(method, url, headers=headers, body=body, _preload_content=False,
                                               _request_timeout=timeout)
        data = resp.data
        return json.loads(data) if data else None

    def get(self, path: str, **query) -> dict | None:
        try:
            return self.call("GET", path, query=query or None)
        except ApiException as e:
            if e.status == 404:
                return None
            raise


# ---------------------------------------------------------------- containers
@dataclass
class Container:
    spec: dict
    dir: Path
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    proc: subprocess.Popen | None = None
    started_at: str = ""
    started_mono: float = 0.0
    terminated: dict | None = None  # the current state's "terminated" block
    last: dict | None = None  # lastState.terminated
    restarts: int = 0
    backoff_s: float = 0.0
    backoff_until: float = 0.0
    ready: bool = False
    next_probe: float = 0.0
    oom: bool = False
    image_id: str = ""  # REGISTRY/REPO@DIGEST once pulled
    pull_attempts: int = 0

    @property
    def name(self) -> str:
        return self.spec["name"]

    def log_path(self, restart: int | None = None) -> Path:
        return self.dir / f"{self.restarts if restart is None else restart}.log"

    def status(self, image: str) -> dict:
        if self.state == "running":
            state = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated":
            state = {"terminated": self.terminated}
        else:
            state = {"waiting": {"reason": self.reason, **({"message": self.message} if self.message else {})}}
        out = {"name": self.name, "image": image, "imageID": self.image_id,
               "ready": self.ready and self.state == "running", "started": self.state == "running",
               "restartCount": self.restarts, "state": state, "lastState": {}}
        if self.proc is not None or self.terminated is not None:
            out["containerID"] = f"loopback://{self.dir.parent.parent.name}-{self.name}-{self.restarts}"
        if self.last is not None:
            out["lastState"] = {"terminated": self.last}
        return out


@dataclass
class PodRuntime:
    uid: str
    namespace: str
    name: str
    dir: Path
    ip: str
    containers: dict[str, Container] = field(default_factory=dict)
    init: dict[str, Container] = field(default_factory=dict)  # run one after another, before the rest
    started_at: str = ""
    volumes_ready: bool = False
    volume_dirs: dict[str, Path] = field(default_factory=dict)
    final: bool = False  # phase Succeeded/Failed reported: nothing runs any more
    evicted: dict | None = None
    terminating_since: float | None = None
    kill_at: float | None = None
    last_status: dict | None = None
    next_size_check: float = 0.0

    def all(self) -> list[Container]:
        return [*self.init.values(), *self.containers.values()]

    def initialized(self) -> bool:
        return all(c.state == "terminated" and c.terminated and c.terminated["exitCode"] == 0
                   for c in self.init.values())


# ---------------------------------------------------------------- the kubelet
class Kubelet:
    def __init__(self, a: argparse.Namespace) -> None:
        self.node = a.node
        self.api = Api(a.kubeconfig)
        self.dns_api = Api(a.dns_kubeconfig)
        self.root = Path(a.root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.cpu, self.memory = a.cpu, a.memory
        self.port = a.port
        self.ip_prefix = a.ip_prefix
        self.apiserver = urlparse(a.apiserver)
        self.ca = Path(a.ca)
        self.images = runtime.ImageStore(Path(a.image_store))
        self.pulls: dict[str, Future] = {}  # image reference -> its pull, one at a time as a kubelet does
        self.puller = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pull")
        self.pods: dict[str, PodRuntime] = {}
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.hosts = ""
        self.next_hosts = 0.0
        self.serving = (a.serving_cert, a.serving_key)

    # ------------------------------------------------------------ node and lease
    def register(self) -> None:
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.node, "labels": {
                    "kubernetes.io/hostname": self.node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                    "node.kubernetes.io/instance-type": "loopback"}}}
        try:
            self.api.call("POST", "/api/v1/nodes", body)
        except ApiException as e:
            if e.status != 409:
                raise
        self.report_node()

    def report_node(self) -> None:
        now = now_rfc3339()
        res = {"cpu": self.cpu, "memory": self.memory, "pods": "110", "ephemeral-storage": "100Gi"}

        def cond(t: str, status: str, reason: str, msg: str) -> dict:
            return {"type": t, "status": status, "reason": reason, "message": msg, "lastHeartbeatTime": now,
                    "lastTransitionTime": self.started}

        status = {"capacity": res, "allocatable": res,
                  "conditions": [cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                                 cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                                 cond("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
                                 cond("Ready", "True", "KubeletReady", "loopback kubelet is posting ready status")],
                  "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                {"type": "Hostname", "address": self.node}],
                  "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
                  "nodeInfo": {"machineID": self.node, "systemUUID": self.node, "bootID": self.boot_id,
                               "kernelVersion": os.uname().release, "osImage": "loopback",
                               "containerRuntimeVersion": "loopback://1", "kubeletVersion": VERSION,
                               "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}
        self.api.call("PATCH", f"/api/v1/nodes/{self.node}/status", {"status": status},
                      content_type="application/strategic-merge-patch+json")

    def renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.node}"
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        lease = self.api.get(path)
        if lease is None:
            node = self.api.get(f"/api/v1/nodes/{self.node}") or {}
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.node, "namespace": "kube-node-lease", "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": self.node,
                         "uid": node.get("metadata", {}).get("uid", "")}]},
                    "spec": {"holderIdentity": self.node, "leaseDurationSeconds": LEASE_DURATION_S,
                             "renewTime": now}}
            self.api.call("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", body)
            return
        lease["spec"]["renewTime"] = now
        self.api.call("PUT", path, lease)

    def heartbeat(self) -> None:
        next_status = time.monotonic() + NODE_STATUS_S
        while not self.stop.wait(LEASE_S):
            try:
                self.renew_lease()
                if time.monotonic() >= next_status:
                    self.report_node()
                    next_status = time.monotonic() + NODE_STATUS_S
            except Exception as e:  # noqa: BLE001 - the API may be away; a kubelet keeps trying
                log(f"heartbeat: {short(e)}")

    # ------------------------------------------------------------ pods
    def pod_ip(self) -> str:
        counter = self.root / "next-ip"
        n = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(n + 1))
        return f"{self.ip_prefix}.{n // 250}.{n % 250 + 2}"  # never reused while the node lives

    def sync(self) -> None:
        listed = self.api.call("GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={self.node}"})
        pods = {p["metadata"]["uid"]: p for p in (listed or {}).get("items") or []}
        with self.lock:
            for uid in [u for u in self.pods if u not in pods]:  # gone from the API (force-deleted)
                self.kill_pod(self.pods.pop(uid), 0)
            for uid, pod in pods.items():
                rt = self.pods.get(uid)
                if rt is None:
                    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                        continue
                    meta = pod["metadata"]
                    rt = PodRuntime(uid, meta["namespace"], meta["name"], self.root / "pods" / uid, self.pod_ip(),
                                    started_at=now_rfc3339())
                    rt.dir.mkdir(parents=True, exist_ok=True)
                    for kind, target in (("initContainers", rt.init), ("containers", rt.containers)):
                        for c in pod["spec"].get(kind) or []:
                            d = rt.dir / "containers" / c["name"]
                            d.mkdir(parents=True, exist_ok=True)
                            target[c["name"]] = Container(c, d)
                    self.pods[uid] = rt
                    log(f"pod {rt.namespace}/{rt.name} bound here, address {rt.ip}")
                try:
                    self.step(rt, pod)
                except ApiException as e:
                    log(f"pod {rt.namespace}/{rt.name}: API {e.status} {e.reason}")

    def step(self, rt: PodRuntime, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        if meta.get("deletionTimestamp"):
            if self.terminate(rt, pod):
                self.report(rt, pod)
                try:
                    self.api.call("DELETE", f"/api/v1/namespaces/{rt.namespace}/pods/{rt.name}",
                                  {"gracePeriodSeconds": 0, "preconditions": {"uid": rt.uid}})
                except ApiException as e:
                    if e.status not in (404, 409):
                        raise
                self.forget(rt)
            return
        if rt.final:
            return
        if not rt.volumes_ready:
            try:
                self.setup_volumes(rt, pod)
                rt.volumes_ready = True
            except MountError as e:
                for c in rt.all():
                    c.reason, c.message = "ContainerCreating", str(e)
                self.report(rt, pod)
                return
        now = time.monotonic()
        if now >= rt.next_size_check:
            rt.next_size_check = now + 1.0
            self.check_empty_dirs(rt, pod)
            if rt.evicted:
                self.report(rt, pod)
                return
        policy = spec.get("restartPolicy", "Always")
        if not self.run_init(rt, pod, policy, now):
            self.report(rt, pod)
            return
        for c in rt.containers.values():
            self.step_container(rt, pod, c, policy, now)
        if self.pod_finished(rt, policy):
            rt.final = True
        self.report(rt, pod)
        if rt.final:
            self.forget(rt)

    def run_init(self, rt: PodRuntime, pod: dict, policy: str, now: float) -> bool:
        """Init containers in order, each to success; ``True`` once all have succeeded. A failed one is
        restarted unless the pod's restartPolicy is Never, when the pod fails."""
        for c in rt.init.values():
            if c.state == "terminated" and c.terminated and c.terminated["exitCode"] == 0:
                continue
            self.step_container(rt, pod, c, "Never" if policy == "Never" else "OnFailure", now)
            if c.state == "terminated" and c.terminated and c.terminated["exitCode"] == 0:
                continue
            if c.state == "terminated" and policy == "Never":
                rt.final = True
            return False
        return True

    def step_container(self, rt: PodRuntime, pod: dict, c: Container, policy: str, now: float) -> None:
        if c.state == "running":
            assert c.proc is not None
            code = c.proc.poll()
            if code is None:
                self.check_memory(rt, c)
                self.probe(rt, c, now)
                return
            self.finished(c, code)
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                return
            # Restart: at once the first time, then after a doubling back-off (CrashLoopBackOff).
            if now - c.started_mono > BACKOFF_RESET_S:
                c.backoff_s = 0.0
            c.last, c.terminated = c.terminated, None
            c.restarts += 1
            c.backoff_until = now + c.backoff_s
            c.backoff_s = min(BACKOFF_MAX_S, c.backoff_s * 2 if c.backoff_s else BACKOFF_START_S)
            c.state = "waiting"
            c.reason = "CrashLoopBackOff" if c.backoff_until > now else "ContainerCreating"
            c.message = (f"back-off {c.backoff_until - now:.0f}s restarting failed container={c.name} "
                         f"pod={rt.name}_{rt.namespace}({rt.uid})") if c.backoff_until > now else ""
        if c.state != "waiting" or now < c.backoff_until:
            return
        self.start_container(rt, pod, c)

    def image_for(self, c: Container) -> runtime.Image | None:
        """The container's image once pulled (in the background: the sync loop never waits on a pull);
        ``None`` while pulling or after a failed pull, with the container's waiting reason set."""
        ref = c.spec.get("image", "")
        policy = c.spec.get("imagePullPolicy") or (
            "Always" if ":" not in ref.rsplit("/", 1)[-1] or ref.endswith(":latest") else "IfNotPresent")
        present = self.images.present(ref)
        if present is not None and (policy != "Always" or c.image_id):
            return present
        if policy == "Never":
            c.reason = "ErrImageNeverPull"
            c.message = f'Container image "{ref}" is not present with pull policy of Never'
            c.backoff_until = time.monotonic() + BACKOFF_START_S
            return None
        pull = self.pulls.get(ref)
        if pull is None:
            self.pulls[ref] = self.puller.submit(self.images.pull, ref)
            c.reason, c.message = "ContainerCreating", f'Pulling image "{ref}"'
            return None
        if not pull.done():
            return None
        del self.pulls[ref]
        try:
            image = pull.result()
        except (runtime.PullError, OSError, subprocess.SubprocessError) as e:
            c.pull_attempts += 1
            first = c.pull_attempts == 1
            c.reason = "ErrImagePull" if first else "ImagePullBackOff"
            c.message = str(e) if first else f'Back-off pulling image "{ref}"'
            c.backoff_until = time.monotonic() + min(BACKOFF_MAX_S, BACKOFF_START_S * c.pull_attempts)
            return None
        log(f"pulled {ref} ({image.digest[:19]})")
        return image

    def start_container(self, rt: PodRuntime, pod: dict, c: Container) -> None:
        image = self.image_for(c)
        if image is None:
            return
        c.image_id = f"{runtime.untagged(c.spec.get('image', ''))}@{image.digest}"
        try:
            env = self.environment(rt, pod, c, image)
            uid, gid = runtime.ids(image, pod["spec"].get("securityContext") or {},
                                   c.spec.get("securityContext") or {})
        except (ConfigError, runtime.UserError) as e:
            c.reason, c.message = "CreateContainerConfigError", str(e)
            c.backoff_until = time.monotonic() + 1.0
            return
        # Kubernetes' rule: command replaces the image's ENTRYPOINT and drops its CMD; args replace CMD.
        if c.spec.get("command"):
            argv = [*c.spec["command"], *(c.spec.get("args") or [])]
        else:
            argv = [*image.entrypoint, *(c.spec.get("args") or image.cmd)]
        argv = [expand(x, env) for x in argv]
        mounts = self.mounts(rt, pod, c)
        if not argv or not runtime.find_executable(image, argv[0], env["PATH"], mounts):
            c.state = "terminated"
            c.terminated = {"exitCode": 128, "reason": "StartError", "startedAt": now_rfc3339(),
                            "finishedAt": now_rfc3339(),
                            "message": f'exec: "{argv[0] if argv else ""}": executable file not found in $PATH'}
            c.proc = None
            return
        read_only = bool((c.spec.get("securityContext") or {}).get("readOnlyRootFilesystem"))
        command = runtime.container_argv(image, c.dir, rt.name, mounts, argv, uid, gid,
                                         c.spec.get("workingDir") or image.workdir, read_only)
        log_file = c.log_path().open("ab")
        c.proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=env, cwd="/", start_new_session=True)
        log_file.close()
        (c.dir / "pid").write_text(str(c.proc.pid))
        c.state, c.reason, c.message = "running", "", ""
        c.started_at, c.started_mono = now_rfc3339(), time.monotonic()
        c.ready = False
        c.next_probe = time.monotonic() + float((c.spec.get("readinessProbe") or {}).get("initialDelaySeconds", 0))
        c.oom = False
        log(f"pod {rt.namespace}/{rt.name}: started container {c.name} (pid {c.proc.pid})")

    def finished(self, c: Container, code: int) -> None:
        if code < 0:  # killed by a signal: what a runtime reports as 128 + signal
            code = 128 - code
        reason = "OOMKilled" if c.oom else ("Completed" if code == 0 else "Error")
        term = {"exitCode": code, "reason": reason, "startedAt": c.started_at, "finishedAt": now_rfc3339(),
                "containerID": f"loopback://{c.dir.parent.parent.name}-{c.name}-{c.restarts}"}
        if code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            term["message"] = tail(c.log_path(), LOG_TAIL_LINES, LOG_TAIL_BYTES)
        c.state, c.terminated, c.ready = "terminated", term, False
        (c.dir / "pid").unlink(missing_ok=True)

    def pod_finished(self, rt: PodRuntime, policy: str) -> bool:
        cs = rt.containers.values()
        if policy == "Always":
            return False
        if policy == "OnFailure":
            return all(c.state == "terminated" and c.terminated and c.terminated["exitCode"] == 0 for c in cs)
        return all(c.state == "terminated" for c in cs)

    # ------------------------------------------------------------ status
    def phase(self, rt: PodRuntime, policy: str) -> str:
        cs = list(rt.containers.values())
        if rt.evicted:
            return "Failed"
        if not rt.initialized():
            return "Failed" if rt.final else "Pending"
        if all(c.state == "terminated" for c in cs) and (policy == "Never" or rt.terminating_since is not None or (
                policy == "OnFailure" and all(c.terminated and c.terminated["exitCode"] == 0 for c in cs))):
            return "Succeeded" if all(c.terminated and c.terminated["exitCode"] == 0 for c in cs) else "Failed"
        if any(c.state == "running" or c.restarts for c in cs) or (
                any(c.state == "terminated" for c in cs)):
            return "Running"
        return "Pending"

    def report(self, rt: PodRuntime, pod: dict) -> None:
        spec = pod["spec"]
        phase = self.phase(rt, spec.get("restartPolicy", "Always"))
        by_name = {c["name"]: c.get("image", "") for c in spec["containers"]}
        by_name.update({c["name"]: c.get("image", "") for c in spec.get("initContainers") or []})
        statuses = [c.status(by_name[n]) for n, c in rt.containers.items()]
        ready = all(s["ready"] for s in statuses)
        old = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}

        def cond(t: str, ok: bool, reason: str | None = None, message: str | None = None) -> dict:
            status = "True" if ok else "False"
            prev = old.get(t)
            since = prev["lastTransitionTime"] if prev and prev.get("status") == status else now_rfc3339()
            out = {"type": t, "status": status, "lastProbeTime": None, "lastTransitionTime": since}
            if reason:
                out["reason"] = reason
            if message:
                out["message"] = message
            return out

        not_ready = None if ready else "ContainersNotReady"
        conditions = [cond("PodReadyToStartContainers", rt.volumes_ready), cond("Initialized", rt.initialized()),
                      cond("ContainersReady", ready, not_ready), cond("Ready", ready, not_ready)]
        if "PodScheduled" in old:
            conditions.append(old["PodScheduled"])
        status: dict = {"phase": phase, "conditions": conditions, "hostIP": "127.0.0.1",
                        "hostIPs": [{"ip": "127.0.0.1"}], "podIP": rt.ip, "podIPs": [{"ip": rt.ip}],
                        "startTime": rt.started_at, "containerStatuses": statuses}
        if rt.init:
            status["initContainerStatuses"] = [c.status(by_name[n]) for n, c in rt.init.items()]
        if rt.evicted:
            # As the real kubelet's eviction of a pod past an emptyDir's sizeLimit: no DisruptionTarget
            # condition (it sets one only for evictions under node pressure).
            status.update(reason="Evicted", message=rt.evicted["message"])
        if status == rt.last_status:
            return
        self.api.call("PATCH", f"/api/v1/namespaces/{rt.namespace}/pods/{rt.name}/status", {"status": status},
                      content_type="application/merge-patch+json")
        rt.last_status = status

    # ------------------------------------------------------------ termination
    def terminate(self, rt: PodRuntime, pod: dict) -> bool:
        """Graceful deletion; ``True`` once every container has stopped."""
        now = time.monotonic()
        if rt.terminating_since is None:
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace
            rt.terminating_since, rt.kill_at = now, now + float(grace)
            log(f"pod {rt.namespace}/{rt.name}: deleting, grace period {grace} s")
            for c in rt.all():
                signal_group(c, signal.SIGTERM)
                if c.state == "waiting":
                    c.state = "terminated"
                    c.terminated = {"exitCode": 137, "reason": "ContainerStatusUnknown",
                                    "message": "The container could not be located when the pod was terminated",
                                    "startedAt": None, "finishedAt": now_rfc3339()}
        if rt.kill_at is not None and now >= rt.kill_at:
            for c in rt.all():
                signal_group(c, signal.SIGKILL)
        done = True
        for c in rt.all():
            if c.state == "running":
                assert c.proc is not None
                code = c.proc.poll()
                if code is None:
                    done = False
                else:
                    self.finished(c, code)
        return done

    def kill_pod(self, rt: PodRuntime, grace_s: float) -> None:
        for c in rt.all():
            signal_group(c, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for c in rt.all():
            if c.proc is None:
                continue
            while c.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            signal_group(c, signal.SIGKILL)
            c.proc.wait()
            (c.dir / "pid").unlink(missing_ok=True)

    def forget(self, rt: PodRuntime) -> None:
        """The pod is done here. Its logs stay readable until the pod object is gone."""
        self.release_volumes(rt)

    # ------------------------------------------------------------ resources
    def check_memory(self, rt: PodRuntime, c: Container) -> None:
        limit = ((c.spec.get("resources") or {}).get("limits") or {}).get("memory")
        if not limit or c.proc is None:
            return
        if group_rss(c.proc.pid) > float(parse_quantity(limit)):
            log(f"pod {rt.namespace}/{rt.name}: container {c.name} passed its memory limit {limit}: OOMKilled")
            c.oom = True
            signal_group(c, signal.SIGKILL)

    def check_empty_dirs(self, rt: PodRuntime, pod: dict) -> None:
        for vol in pod["spec"].get("volumes") or []:
            limit = (vol.get("emptyDir") or {}).get("sizeLimit")
            path = rt.volume_dirs.get(vol["name"])
            if not limit or path is None or "emptyDir" not in vol:
                continue
            if dir_size(path) > float(parse_quantity(limit)):
                message = f'Usage of EmptyDir volume "{vol["name"]}" exceeds the limit "{limit}". '
                log(f"pod {rt.namespace}/{rt.name}: evicted: {message}")
                rt.evicted = {"message": message}
                self.kill_pod(rt, 0)
                for c in rt.all():
                    if c.state == "running" and c.proc is not None:
                        self.finished(c, c.proc.poll() or 137)
                    elif c.state == "waiting":
                        c.state, c.terminated = "terminated", {"exitCode": 137, "reason": "Error",
                                                               "finishedAt": now_rfc3339()}
                rt.final = True
                return

    def probe(self, rt: PodRuntime, c: Container, now: float) -> None:
        spec = c.spec.get("readinessProbe")
        if spec is None:
            c.ready = True
            return
        if now < c.next_probe:
            return
        c.next_probe = now + float(spec.get("periodSeconds", 10))
        timeout = float(spec.get("timeoutSeconds", 1))
        try:
            if "httpGet" in spec:
                g = spec["httpGet"]
                port = named_port(c.spec, g["port"])
                with socket.create_connection((rt.ip, port), timeout=timeout) as s:
                    s.settimeout(timeout)
                    s.sendall(f"GET {g.get('path', '/')} HTTP/1.0\r\nHost: {rt.ip}\r\n\r\n".encode())
                    head = s.recv(64).decode(errors="replace")
                code = int(head.split()[1]) if head.startswith("HTTP/") else 0
                c.ready = 200 <= code < 400
            elif "tcpSocket" in spec:
                with socket.create_connection((rt.ip, named_port(c.spec, spec["tcpSocket"]["port"])),
                                              timeout=timeout):
                    c.ready = True
            else:
                c.ready = True  # exec probes: not run here (see the module docstring)
        except (OSError, ValueError, IndexError):
            c.ready = False

    # ------------------------------------------------------------ env and volumes
    def environment(self, rt: PodRuntime, pod: dict, c: Container, image: runtime.Image) -> dict[str, str]:
        port = self.apiserver.port or 443
        env = {"PATH": DEFAULT_PATH, "HOME": "/", "HOSTNAME": rt.name, **image.env,
               "KUBERNETES_SERVICE_HOST": self.apiserver.hostname or "127.0.0.1",
               "KUBERNETES_SERVICE_PORT": str(port), "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
               "KUBERNETES_PORT": f"tcp://127.0.0.1:{port}"}
        ns = rt.namespace
        for src in c.spec.get("envFrom") or []:
            prefix = src.get("prefix", "")
            for kind, ref in (("secrets", src.get("secretRef")), ("configmaps", src.get("configMapRef"))):
                if ref is None:
                    continue
                data = self.source(kind, ns, ref["name"], ref.get("optional", False))
                env.update({prefix + k: v for k, v in data.items()})
        for e in c.spec.get("env") or []:
            if "valueFrom" not in e:
                env[e["name"]] = expand(e.get("value", ""), env)
                continue
            src = e["valueFrom"]
            if "secretKeyRef" in src or "configMapKeyRef" in src:
                kind, ref = ("secrets", src["secretKeyRef"]) if "secretKeyRef" in src else (
                    "configmaps", src["configMapKeyRef"])
                data = self.source(kind, ns, ref["name"], ref.get("optional", False))
                if ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    what = "Secret" if kind == "secrets" else "ConfigMap"
                    raise ConfigError(f"couldn't find key {ref['key']} in {what} {ns}/{ref['name']}")
                env[e["name"]] = data[ref["key"]]
            elif "fieldRef" in src:
                env[e["name"]] = self.field(rt, pod, src["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in src:
                r = src["resourceFieldRef"]
                c2 = next(x for x in pod["spec"]["containers"] if x["name"] == r.get("containerName", c.name))
                kind, _, res = r["resource"].partition(".")
                value = ((c2.get("resources") or {}).get(kind) or {}).get(res, "0")
                divisor = float(parse_quantity(r.get("divisor", "1")))
                env[e["name"]] = str(int(-(-float(parse_quantity(value)) // divisor)))
        return env

    def source(self, kind: str, ns: str, name: str, optional: bool) -> dict[str, str]:
        obj = self.api.get(f"/api/v1/namespaces/{ns}/{kind}/{name}")
        if obj is None:
            if optional:
                return {}
            raise ConfigError(f'{"secret" if kind == "secrets" else "configmap"} "{name}" not found')
        if kind == "secrets":
            return {k: base64.b64decode(v).decode(errors="replace") for k, v in (obj.get("data") or {}).items()}
        return dict(obj.get("data") or {})

    def field(self, rt: PodRuntime, pod: dict, path: str) -> str:
        meta = pod["metadata"]
        simple = {"metadata.name": rt.name, "metadata.namespace": rt.namespace, "metadata.uid": rt.uid,
                  "spec.nodeName": self.node, "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
                  "status.podIP": rt.ip, "status.podIPs": rt.ip, "status.hostIP": "127.0.0.1",
                  "status.hostIPs": "127.0.0.1"}
        if path in simple:
            return simple[path]
        m = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
        if m:
            return (meta.get(m[1]) or {}).get(m[2], "")
        if path in ("metadata.labels", "metadata.annotations"):
            return "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get(path.split(".")[1]) or {}).items()))
        raise ConfigError(f"fieldPath {path!r} is not supported")

    def setup_volumes(self, rt: PodRuntime, pod: dict) -> None:
        base = rt.dir / "volumes"
        for vol in pod["spec"].get("volumes") or []:
            d = base / vol["name"]
            d.mkdir(parents=True, exist_ok=True)
            rt.volume_dirs[vol["name"]] = d
            try:
                if "emptyDir" in vol:
                    d.chmod(0o777)  # as a kubelet makes it: writable by whatever user the containers run as
                    continue
                if "secret" in vol or "configMap" in vol:
                    kind, ref = ("secrets", vol["secret"]) if "secret" in vol else ("configmaps", vol["configMap"])
                    name = ref.get("secretName") or ref.get("name")
                    self.write_items(d, self.source(kind, rt.namespace, name, ref.get("optional", False)),
                                     ref.get("items"))
                elif "projected" in vol:
                    for src in vol["projected"].get("sources") or []:
                        self.project(rt, pod, d, src)
                else:
                    kind = next(iter(k for k in vol if k != "name"), "?")
                    raise MountError(f"volume {vol['name']!r}: {kind} volumes are not supported by this kubelet")
            except ConfigError as e:
                raise MountError(f"MountVolume.SetUp failed for volume {vol['name']!r}: {e}") from e
        hosts = rt.dir / "hosts"
        hosts.write_text(self.hosts_for(rt))

    def project(self, rt: PodRuntime, pod: dict, d: Path, src: dict) -> None:
        if "serviceAccountToken" in src:
            t = src["serviceAccountToken"]
            sa = pod["spec"].get("serviceAccountName") or "default"
            body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "spec": {"audiences": [t["audience"]] if t.get("audience") else None,
                             "expirationSeconds": int(t.get("expirationSeconds", 3607)),
                             "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": rt.name, "uid": rt.uid}}}
            resp = self.api.call("POST", f"/api/v1/namespaces/{rt.namespace}/serviceaccounts/{sa}/token", body)
            (d / t["path"]).write_text(resp["status"]["token"])
        elif "configMap" in src or "secret" in src:
            kind, ref = ("configmaps", src["configMap"]) if "configMap" in src else ("secrets", src["secret"])
            self.write_items(d, self.source(kind, rt.namespace, ref["name"], ref.get("optional", False)),
                             ref.get("items"))
        elif "downwardAPI" in src:
            for item in src["downwardAPI"].get("items") or []:
                (d / item["path"]).write_text(self.field(rt, pod, item["fieldRef"]["fieldPath"]))

    @staticmethod
    def write_items(d: Path, data: dict[str, str], items: list[dict] | None) -> None:
        pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
        for key, path in pairs:
            if key not in data:
                raise ConfigError(f"couldn't find key {key}")
            target = d / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[key])

    def mounts(self, rt: PodRuntime, pod: dict, c: Container) -> list[tuple[str, str, bool]]:
        out = [(str(rt.dir / "hosts"), "/etc/hosts", False)]
        for vm in c.spec.get("volumeMounts") or []:
            src = rt.volume_dirs[vm["name"]]
            if vm.get("subPath"):
                src = src / vm["subPath"]
                src.mkdir(parents=True, exist_ok=True)
            out.append((str(src), vm["mountPath"], bool(vm.get("readOnly"))))
        return out

    def release_volumes(self, rt: PodRuntime) -> None:
        for name, d in rt.volume_dirs.items():
            if name.startswith("kube-api-access"):
                shutil.rmtree(d, ignore_errors=True)  # the token does not outlive the pod

    # ------------------------------------------------------------ names of Services
    def hosts_for(self, rt: PodRuntime) -> str:
        return (f"127.0.0.1\tlocalhost\n{rt.ip}\t{rt.name}\n" + self.hosts)

    def refresh_hosts(self) -> None:
        now = time.monotonic()
        if now < self.next_hosts:
            return
        self.next_hosts = now + 1.0
        services = (self.dns_api.get("/api/v1/services") or {}).get("items") or []
        pods = (self.dns_api.get("/api/v1/pods") or {}).get("items") or []
        ready: dict[str, list[dict]] = {}
        for p in pods:
            st = p.get("status") or {}
            if st.get("podIP") and not p["metadata"].get("deletionTimestamp") and any(
                    c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or []):
                ready.setdefault(p["metadata"]["namespace"], []).append(p)
        lines = []
        for svc in services:
            meta, sel = svc["metadata"], (svc.get("spec") or {}).get("selector")
            if not sel:
                continue
            match = [p for p in ready.get(meta["namespace"], [])
                     if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())]
            if match:
                match.sort(key=lambda p: p["metadata"]["creationTimestamp"])
                n, ns = meta["name"], meta["namespace"]
                lines.append(f"{match[-1]['status']['podIP']}\t{n}.{ns}.svc.cluster.local {n}.{ns}.svc {n}.{ns}")
        hosts = "".join(line + "\n" for line in sorted(lines))
        if hosts == self.hosts:
            return
        self.hosts = hosts
        with self.lock:
            for rt in self.pods.values():
                path = rt.dir / "hosts"
                if path.exists():
                    with path.open("r+") as f:  # in place: the containers bind-mount this very file
                        f.write(self.hosts_for(rt))
                        f.truncate()

    # ------------------------------------------------------------ logs
    def find_container(self, ns: str, name: str, container: str) -> Container | None:
        with self.lock:
            for rt in self.pods.values():
                if rt.namespace == ns and rt.name == name:
                    return rt.containers.get(container) or rt.init.get(container)
        return None

    def serve_logs(self) -> ThreadingHTTPServer:
        kubelet = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                url = urlparse(self.path)
                m = re.match(r"^/containerLogs/([^/]+)/([^/]+)/([^/]+)$", url.path)
                if not m:
                    self.send_error(404, "only /containerLogs is served")
                    return
                q = {k: v[-1] for k, v in parse_qs(url.query).items()}
                c = kubelet.find_container(*m.groups())
                if c is None:
                    self.send_error(404, f"container {m[3]} of pod {m[1]}/{m[2]} is not on this node")
                    return
                previous = q.get("previous") == "true"
                if previous and c.restarts == 0:
                    self.send_error(400, f'previous terminated container "{c.name}" not found')
                    return
                path = c.log_path(c.restarts - 1 if previous else None)
                data = path.read_bytes() if path.exists() else b""
                if "tailLines" in q:
                    n = int(q["tailLines"])
                    data = b"".join(data.splitlines(keepends=True)[-n:]) if n > 0 else b""
                if "limitBytes" in q:
                    data = data[: int(q["limitBytes"])]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(data)
                if q.get("follow") != "true" or previous:
                    return
                offset = path.stat().st_size if path.exists() else 0
                while not kubelet.stop.is_set():
                    with path.open("rb") as f:
                        f.seek(offset)
                        chunk = f.read()
                    if chunk:
                        offset += len(chunk)
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    elif c.state != "running":
                        return
                    time.sleep(0.2)

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*self.serving)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True, name="logs").start()
        return server

    # ------------------------------------------------------------ main loop
    def run(self) -> None:
        self.started = now_rfc3339()
        self.boot_id = str(uuid.uuid4())
        self.serve_logs()
        while not self.stop.is_set():
            try:
                self.register()
                break
            except Exception as e:  # noqa: BLE001
                log(f"register: {short(e)}")
                self.stop.wait(1)
        threading.Thread(target=self.heartbeat, daemon=True, name="heartbeat").start()
        log(f"node {self.node} registered: cpu {self.cpu}, memory {self.memory}, logs on port {self.port}")
        while not self.stop.is_set():
            try:
                self.refresh_hosts()
                self.sync()
            except Exception as e:  # noqa: BLE001 - the API may be away; a kubelet keeps trying
                log(f"sync: {short(e)}")
            self.stop.wait(TICK_S)
        with self.lock:
            for rt in list(self.pods.values()):
                self.kill_pod(rt, 2)

    def shutdown(self, *_: object) -> None:
        self.stop.set()


# ---------------------------------------------------------------- helpers
def log(message: str) -> None:
    print(f"{datetime.now().strftime('%H:%M:%S.%f')[:-3]} {message}", flush=True)


def short(e: Exception) -> str:
    if isinstance(e, ApiException):
        return f"API {e.status} {e.reason}"
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` references: known names are replaced, ``$$`` is a literal ``$``."""
    def sub(m: re.Match) -> str:
        if m[0] == "$$":
            return "$"
        return env.get(m[1], m[0])

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, value)


def named_port(spec: dict, port) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in spec.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"no port named {port}")


def signal_group(c: Container, sig: int) -> None:
    if c.proc is None or c.proc.poll() is not None:
        return
    try:
        os.killpg(c.proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_rss(pgid: int) -> float:
    """Bytes resident in every process of the process group ``pgid``."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return float(total)


def dir_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def tail(path: Path, lines: int, limit: int) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    text = b"".join(data.splitlines(keepends=True)[-lines:])[-limit:]
    return text.decode(errors="replace")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kubelet", description="the plane's loopback kubelet (one node)")
    p.add_argument("--node", required=True, help="the Node's name")
    p.add_argument("--kubeconfig", required=True, help="the node's own credentials (system:node:NAME)")
    p.add_argument("--dns-kubeconfig", required=True, help="credentials to read Services and pods for names")
    p.add_argument("--root", required=True, help="directory for pods' volumes and logs")
    p.add_argument("--cpu", default="4", help="CPU capacity")
    p.add_argument("--memory", default="16Gi", help="memory capacity")
    p.add_argument("--port", type=int, required=True, help="port of the log server (HTTPS)")
    p.add_argument("--serving-cert", required=True, help="the log server's certificate")
    p.add_argument("--serving-key", required=True, help="the log server's key")
    p.add_argument("--ip-prefix", required=True, help="pods get addresses PREFIX.X.Y")
    p.add_argument("--apiserver", required=True, help="the apiserver's URL, for pods' in-cluster config")
    p.add_argument("--ca", required=True, help="the cluster CA")
    p.add_argument("--image-store", required=True, help="where images are unpacked, by digest (shared by nodes)")
    a = p.parse_args(argv)
    kubelet = Kubelet(a)
    signal.signal(signal.SIGTERM, kubelet.shutdown)
    signal.signal(signal.SIGINT, kubelet.shutdown)
    kubelet.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
