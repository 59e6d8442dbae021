"""FakeKubeApiServer: a TEST DOUBLE of the Kubernetes API server, for this machine has no cluster.

It speaks, over real HTTP on loopback, the REST paths and semantics that
``edl.cluster.kubernetes`` uses, and nothing more:
- core/v1 nodes, pods, services, secrets, events, podtemplates,
  coordination.k8s.io/v1 leases and scheduling.k8s.io/v1 priorityclasses; namespaced and all-namespace collections;
- get, list (``labelSelector`` with ``a=b`` terms), create (409 AlreadyExists),
  replace (409 Conflict on a stale ``resourceVersion``), delete (404 when gone);
- watch with ``resourceVersion``: events after that version, streamed as JSON
  lines until ``timeoutSeconds``; a version older than the retained history
  gets the real server's ``ERROR`` event with a 410 Expired status;
- bearer-token authentication (401 otherwise); uid, resourceVersion and
  creationTimestamp set on create; labels and ownerReferences kept as sent.

Tests play kubelet and scheduler through ``set_pod`` / ``put`` / ``remove``.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

TOKEN = "test-double-token"
KINDS = {"nodes": "Node", "pods": "Pod", "services": "Service", "secrets": "Secret", "events": "Event",
         "podtemplates": "PodTemplate", "leases": "Lease", "priorityclasses": "PriorityClass"}
CLUSTER_SCOPED = {"nodes", "priorityclasses"}
_PATH = re.compile(r"^/(?:api/v1|apis/coordination\.k8s\.io/v1|apis/scheduling\.k8s\.io/v1)"
                   r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[a-z]+)"
                   r"(?:/(?P<name>[^/]+))?(?P<sub>/status)?$")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}


class Store:
    def __init__(self, history: int) -> None:
        self.objects: dict[tuple[str, str, str], dict] = {}  # (resource, namespace, name)
        self.rv = 100
        self.events: list[tuple[int, str, str, dict]] = []  # (rv, type, resource, object)
        self.history = history
        self.cond = threading.Condition()
        self.requests: list[tuple[str, str]] = []  # (method, path) for tests to inspect

    def _record(self, etype: str, res: str, obj: dict) -> None:
        self.events.append((self.rv, etype, res, copy.deepcopy(obj)))
        del self.events[: max(0, len(self.events) - self.history)]
        self.cond.notify_all()

    def put(self, res: str, obj: dict, etype: str | None = None) -> dict:
        with self.cond:
            meta = obj.setdefault("metadata", {})
            ns = "" if res in CLUSTER_SCOPED else meta.setdefault("namespace", "default")
            key = (res, ns, meta["name"])
            existed = key in self.objects
            self.rv += 1
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta["resourceVersion"] = str(self.rv)
            obj.setdefault("kind", KINDS[res])
            self.objects[key] = obj
            self._record(etype or ("MODIFIED" if existed else "ADDED"), res, obj)
            return copy.deepcopy(obj)

    def remove(self, res: str, ns: str, name: str) -> dict | None:
        with self.cond:
            obj = self.objects.pop((res, "" if res in CLUSTER_SCOPED else ns, name), None)
            if obj is not None:
                self.rv += 1
                obj["metadata"]["resourceVersion"] = str(self.rv)
                self._record("DELETED", res, obj)
            return obj

    def select(self, res: str, ns: str | None, selector: str | None) -> list[dict]:
        terms = [t.split("=", 1) for t in selector.split(",")] if selector else []
        out = []
        for (r, ons, _), obj in self.objects.items():
            if r != res or (ns is not None and ons != ns):
                continue
            labels = obj["metadata"].get("labels") or {}
            if all(labels.get(k) == v for k, v in terms):
                out.append(copy.deepcopy(obj))
        return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # watch streams are chunked, as the real server's are
    store: Store

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self):
        url = urlparse(self.path)
        m = _PATH.match(url.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.store.requests.append((self.command, self.path))
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(401, _status(401, "Unauthorized", "Unauthorized"))
            return None
        if not m or m["res"] not in KINDS:
            self._send(404, _status(404, "NotFound", f"no route {url.path}"))
            return None
        return m["res"], m["ns"], m["name"], q

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def do_GET(self) -> None:
        r = self._route()
        if r is None:
            return
        res, ns, name, q = r
        st = self.store
        if name:
            with st.cond:
                obj = st.objects.get((res, "" if res in CLUSTER_SCOPED else ns, name))
            self._send(200, obj) if obj else self._send(404, _status(404, "NotFound", f'{res} "{name}" not found'))
            return
        if q.get("watch") in ("true", "1", "True"):
            self._watch(res, ns, q)
            return
        offset, rv = 0, None
        if q.get("continue"):
            offset, rv = (int(x) for x in q["continue"].split(":"))
        with st.cond:
            items = st.select(res, ns, q.get("labelSelector"))
            rv = rv or st.rv
        meta = {"resourceVersion": str(rv)}
        if q.get("limit"):  # pagination: pages of a (simplified) snapshot, as with limit/continue
            items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
            end = offset + int(q["limit"])
            if end < len(items):
                meta["continue"] = f"{end}:{rv}"
            items = items[offset:end]
        self._send(200, {"kind": KINDS[res] + "List", "apiVersion": "v1", "metadata": meta, "items": items})

    def _watch(self, res: str, ns: str | None, q: dict) -> None:
        st = self.store
        since = int(q.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 30)
        terms = [t.split("=", 1) for t in q["labelSelector"].split(",")] if q.get("labelSelector") else []
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        try:
            self._stream(st, res, ns, since, deadline, terms)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _stream(self, st: Store, res: str, ns: str | None, since: int, deadline: float, terms: list) -> None:
        with st.cond:
            oldest = st.events[0][0] if st.events else st.rv + 1
            if since and since < oldest - 1 and since < st.rv:
                self._line({"type": "ERROR", "object": _status(410, "Expired",
                                                               f"too old resource version: {since} ({oldest - 1})")})
                return
        while time.monotonic() < deadline:
            with st.cond:
                fresh = [e for e in st.events if e[0] > since and e[2] == res]
                if not fresh:
                    st.cond.wait(min(0.2, max(0.0, deadline - time.monotonic())))
                    continue
            for rv, etype, _, obj in fresh:
                since = rv
                meta = obj["metadata"]
                if ns is not None and meta.get("namespace") != ns:
                    continue
                if not all((meta.get("labels") or {}).get(k) == v for k, v in terms):
                    continue
                self._line({"type": etype, "object": obj})

    def _line(self, event: dict) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_POST(self) -> None:
        r = self._route()
        if r is None:
            return
        res, ns, _, _ = r
        obj = self._body()
        name = obj.get("metadata", {}).get("name")
        if not name and obj.get("metadata", {}).get("generateName"):
            name = obj["metadata"]["generateName"] + uuid.uuid4().hex[:5]
            obj["metadata"]["name"] = name
        if ns:
            obj.setdefault("metadata", {})["namespace"] = ns
        with self.store.cond:
            if (res, "" if res in CLUSTER_SCOPED else ns, name) in self.store.objects:
                self._send(409, _status(409, "AlreadyExists", f'{res} "{name}" already exists'))
                return
            if res == "pods":
                obj.setdefault("status", {"phase": "Pending"})
            if res == "secrets" and "stringData" in obj:  # the API server folds stringData into data
                import base64

                data = obj.setdefault("data", {})
                for k, v in obj.pop("stringData").items():
                    data[k] = base64.b64encode(v.encode()).decode()
            self._send(201, self.store.put(res, obj))

    def do_PUT(self) -> None:
        r = self._route()
        if r is None:
            return
        res, ns, name, _ = r
        obj = self._body()
        with self.store.cond:
            cur = self.store.objects.get((res, "" if res in CLUSTER_SCOPED else ns, name))
            if cur is None:
                self._send(404, _status(404, "NotFound", f'{res} "{name}" not found'))
                return
            sent = obj.get("metadata", {}).get("resourceVersion")
            if sent and sent != cur["metadata"]["resourceVersion"]:
                self._send(409, _status(409, "Conflict", "the object has been modified; please apply your changes "
                                                         "to the latest version and try again"))
                return
            obj["metadata"]["uid"] = cur["metadata"]["uid"]
            obj["metadata"]["creationTimestamp"] = cur["metadata"]["creationTimestamp"]
            self._send(200, self.store.put(res, obj))

    def do_DELETE(self) -> None:
        r = self._route()
        if r is None:
            return
        res, ns, name, _ = r
        obj = self.store.remove(res, ns or "", name)
        self._send(200, obj) if obj else self._send(404, _status(404, "NotFound", f'{res} "{name}" not found'))


class FakeKubeApiServer:
    """Start with ``with FakeKubeApiServer() as api:``; ``api.url`` and ``TOKEN`` configure a client."""

    def __init__(self, history: int = 10_000) -> None:
        self.store = Store(history)
        handler = type("Handler", (_Handler,), {"store": self.store})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeKubeApiServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---- what kubelet and the scheduler would do
    def add_node(self, name: str, cpu: str = "16", memory: str = "64Gi", gpu: int = 0) -> dict:
        alloc = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpu)} if gpu else {})}
        return self.store.put("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                                        "status": {"allocatable": alloc, "capacity": alloc}})

    def pod(self, ns: str, name: str) -> dict | None:
        with self.store.cond:
            obj = self.store.objects.get(("pods", ns, name))
            return copy.deepcopy(obj) if obj else None

    def set_pod(self, ns: str, name: str, phase: str, node: str | None = None, **status) -> dict:
        with self.store.cond:
            obj = copy.deepcopy(self.store.objects[("pods", ns, name)])
        if node is not None:
            obj["spec"]["nodeName"] = node
        obj["status"] = {"phase": phase, **status}
        return self.store.put("pods", obj)

    def objects(self, res: str, ns: str | None = None, selector: str | None = None) -> list[dict]:
        with self.store.cond:
            return self.store.select(res, ns, selector)

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: older watches get 410 Gone."""
        with self.store.cond:
            self.store.events.clear()
            self.store.rv += 1


# ---------------------------------------------------------------------------------------------
class LoopbackKubelet:
    """TEST DOUBLE of the scheduler, kubelet and cluster DNS behind FakeKubeApiServer.

    Binds each Pending pod that ``admit`` accepts to ``node``, gives it a loopback IP of
    its own (127.0.0.N), and runs its containers as local processes: ``edl`` commands
    run with this interpreter, env comes from values, Secrets and the downward API,
    ``--host 0.0.0.0`` binds the pod IP and ``SVC.NS.svc:PORT`` arguments resolve to
    the IP of the pod the Service selects (what cluster DNS and kube-proxy do).
    Container exits become pod phases and terminated container states, with the
    last log lines as the termination message (FallbackToLogsOnError). Deleting a
    pod through the API stops its processes. ``evict`` and ``oom_kill`` play the
    node under pressure.
    """

    def __init__(self, api: FakeKubeApiServer, kubeconfig: str, log_dir, node: str = "node-0",
                 admit=lambda pod: True, base_env: dict | None = None) -> None:
        import os

        self.api = api
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.node = node
        self.admit = admit
        self.base_env = dict(base_env or os.environ)
        self.running: dict[tuple[str, str], dict] = {}  # (ns, name) -> {"uid", "ip", "procs": {container: Popen}}
        self.next_ip = 2
        self.ips: dict[tuple[str, str], str] = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "LoopbackKubelet":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.thread.join(5)
        for key in list(self.running):
            self._kill(key)

    # ------------------------------------------------------------------ helpers
    def _secret(self, ns: str, name: str, key: str) -> str:
        import base64

        with self.api.store.cond:
            obj = self.api.store.objects.get(("secrets", ns, name))
        if obj is None:
            raise KeyError(f"secret {ns}/{name} not found")
        return base64.b64decode(obj["data"][key]).decode()

    def _resolve(self, ns: str, arg: str, pod_ip: str) -> str:
        m = re.match(r"^([a-z0-9-]+)\.([a-z0-9-]+)\.svc:(\d+)$", arg)
        if not m:
            return arg
        with self.api.store.cond:
            svc = self.api.store.objects.get(("services", m[2], m[1]))
        if svc is None:
            return arg
        sel = svc["spec"]["selector"]
        for pod in self.api.objects("pods", m[2]):
            labels = pod["metadata"].get("labels") or {}
            ip = (pod.get("status") or {}).get("podIP")
            if ip and all(labels.get(k) == v for k, v in sel.items()):
                return f"{ip}:{m[3]}"
        return arg

    def _start(self, pod: dict) -> None:
        import subprocess
        import sys

        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        # One address per pod name: a recreated master keeps it, as its Service's address stays put
        # in a real cluster (processes here resolve the Service once, at start).
        ip = self.ips.get((ns, name))
        if ip is None:
            ip = self.ips[(ns, name)] = f"127.0.0.{self.next_ip}"
            self.next_ip = 2 + (self.next_ip - 1) % 250
        pod["spec"]["nodeName"] = self.node
        pod["status"] = {"phase": "Running", "podIP": ip, "containerStatuses": []}
        procs = {}
        for c in pod["spec"]["containers"]:
            env = {**self.base_env, "KUBECONFIG": self.kubeconfig, "PYTHONUNBUFFERED": "1"}
            for e in c.get("env") or []:
                if "value" in e:
                    env[e["name"]] = e["value"]
                    continue
                src = e["valueFrom"]
                if "secretKeyRef" in src:
                    env[e["name"]] = self._secret(ns, src["secretKeyRef"]["name"], src["secretKeyRef"]["key"])
                else:
                    field = src["fieldRef"]["fieldPath"]
                    env[e["name"]] = {"metadata.name": name, "metadata.namespace": ns, "status.podIP": ip}[field]
            args = [self._resolve(ns, a, ip) for a in c.get("args") or []]
            # Containers of a pod share its network: here, the pod's own loopback address.
            args = [ip if a == "0.0.0.0" else re.sub(r"^127\.0\.0\.1:", f"{ip}:", a) for a in args]
            cmd = list(c["command"])
            if cmd[0] == "edl":
                cmd = [sys.executable, "-m", "edl", *cmd[1:]]
            log = open(self.log_dir / f"{ns}-{name}-{c['name']}.log", "ab")
            procs[c["name"]] = subprocess.Popen([*cmd, *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                                start_new_session=True)
            procs[c["name"]].edl_env = env  # kept for a restart in place
            log.close()
        self.running[(ns, name)] = {"uid": meta["uid"], "ip": ip, "procs": procs, "restarts": {}}
        self.api.store.put("pods", pod)

    def _kill(self, key: tuple[str, str], sig: int | None = None) -> None:
        import os
        import signal as sg

        entry = self.running.pop(key, None)
        if entry is None:
            return
        for p in entry["procs"].values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig or sg.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in entry["procs"].values():
            try:
                p.wait(3)
            except Exception:  # noqa: BLE001
                os.killpg(p.pid, sg.SIGKILL)
                p.wait()

    def _tail(self, ns: str, name: str, container: str) -> str:
        try:
            text = (self.log_dir / f"{ns}-{name}-{container}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-20:])[-2048:]

    def _terminate(self, key, pod: dict, codes: dict[str, int], reasons: dict[str, str] | None = None,
                   status_extra: dict | None = None) -> None:
        ns, name = key
        statuses = [{"name": c, "ready": False, "restartCount": 0,
                     "state": {"terminated": {"exitCode": code, "reason": (reasons or {}).get(c) or (
                         "Completed" if code == 0 else "Error"),
                                              "message": self._tail(ns, name, c) if code else ""}}}
                    for c, code in codes.items()]
        pod["status"] = {**pod.get("status", {}), "phase": "Succeeded" if all(v == 0 for v in codes.values())
                         else "Failed", "containerStatuses": statuses, **(status_extra or {})}
        self.running.pop(key, None)
        self.api.store.put("pods", pod)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
            except Exception as e:  # noqa: BLE001 - a test double's hiccup must show, not hang
                print(f"LoopbackKubelet: {e!r}")
            self._stop.wait(0.1)

    def _round(self) -> None:
        pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in self.api.objects("pods")}
        for key in [k for k in self.running if k not in pods or pods[k]["metadata"]["uid"] != self.running[k]["uid"]]:
            self._kill(key)  # deleted through the API
        for key, pod in pods.items():
            phase = (pod.get("status") or {}).get("phase", "Pending")
            if key not in self.running:
                if phase == "Pending" and not pod["spec"].get("nodeName") and self.admit(pod):
                    self._start(pod)
                continue
            entry = self.running[key]
            codes = {c: p.poll() for c, p in entry["procs"].items()}
            if pod["spec"].get("restartPolicy") == "Always":
                for c, code in codes.items():
                    if code is not None:  # restart the container in place, as kubelet does
                        self._restart(key, pod, c)
                continue
            if all(code is not None for code in codes.values()):
                self._terminate(key, pod, codes)

    def _restart(self, key, pod, container: str) -> None:
        import subprocess

        entry = self.running[key]
        old = entry["procs"][container]
        argv = old.args
        log = open(self.log_dir / f"{key[0]}-{key[1]}-{container}.log", "ab")
        new = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=old.edl_env, start_new_session=True)
        new.edl_env = old.edl_env
        entry["procs"][container] = new
        log.close()
        entry["restarts"][container] = entry["restarts"].get(container, 0) + 1

    # ---- what a node under pressure does
    def evict(self, ns: str, name: str) -> None:
        """Kubelet eviction: processes killed, pod Failed with reason Evicted."""
        import signal as sg

        pod = self.api.pod(ns, name)
        entry = self.running.get((ns, name))
        codes = {c: 137 for c in (entry["procs"] if entry else {})}
        self._kill((ns, name), sg.SIGKILL)
        self._terminate((ns, name), pod, codes, status_extra={"reason": "Evicted",
                                                              "message": "The node was low on resource: memory."})

    def oom_kill(self, ns: str, name: str) -> None:
        """The container hit its memory limit."""
        import signal as sg

        pod = self.api.pod(ns, name)
        entry = self.running.get((ns, name))
        containers = list(entry["procs"]) if entry else ["trainer"]
        self._kill((ns, name), sg.SIGKILL)
        self._terminate((ns, name), pod, {c: 137 for c in containers}, {c: "OOMKilled" for c in containers})

