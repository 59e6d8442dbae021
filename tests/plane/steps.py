"""``edl launch`` as a workflow step's pod on the plane, and what tests read back through the API.

``Steps.launch`` creates the pod an Argo step (or a KFP task) would: edl's runtime image from the
plane's registry (the trainers get its trainer image), the
``edl-launcher`` ServiceAccount, the restricted security context, and the step's identity
from the downward API under the names that workflow engine uses (``POD_NAME``/``POD_UID``
as the CronWorkflow sets them; ``KFP_POD_NAME``/``KFP_POD_UID`` as KFP's driver does).
"""

from __future__ import annotations

import io

from kubernetes import client

from tests.plane.fixtures import PRIORITY_CLASSES
from tests.plane.plane import ControlPlane
from tests.waits import wait_for

JOB_RESOURCES = ("pods", "services", "secrets", "leases")


def security() -> dict:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}}


def identity_env(style: str) -> list[dict]:
    prefix = {"argo": "", "kfp": "KFP_"}[style]
    return [{"name": f"{prefix}POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": f"{prefix}POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]


def keeper(image: str) -> dict:
    """The step pod's second container, as Argo's ``wait`` beside ``main``: it holds the pod, and with it the
    step's /tmp, after ``main`` has ended, so that its outputs (the run summary) can be read. A real kubelet
    removes the volumes of a pod that has ended. It leaves at SIGTERM (the pod deleted)."""
    hold = "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); signal.pause()"
    return {"name": "wait", "image": image, "command": ["python", "-c", hold], "securityContext": security(),
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}


class Steps:
    def __init__(self, plane: ControlPlane, kube: client.ApiClient, namespace: str, s3) -> None:
        self.plane = plane
        self.s3 = s3  # the plane's MinIO (tests.plane.s3.MinioServer): the jobs' data and checkpoints
        self.ns = namespace
        self.core = client.CoreV1Api(kube)
        self.coord = client.CoordinationV1Api(kube)
        self.launched: list[str] = []

    # ------------------------------------------------------------ the step
    def launch(self, job: str, *extra: str, epochs: int = 3, max_t: int = 2, trainers: int = 1,
               style: str = "argo", trainer_memory: str = "2Gi", grace_s: int = 40,
               service_account: str = "edl-launcher", model_def: str = "edl.zoo.digits",
               trainer_image: str = "trainer-cpu", step_floor_s: float | None = None) -> str:
        """An ``edl launch`` step's pod for ``job``; ``trainer_image`` names one of edl's images on the plane.
        ``step_floor_s``: the job trains ``floored_model`` (digits, each step at least this long until
        ``full_speed``): a job the test ends itself trains slowly, not on every CPU it is given."""
        if step_floor_s is not None:
            model_def = self.floored_model(job, step_floor_s)
        name = f"step-{job}-{len(self.launched)}"
        args = ["launch", "--job-name", job, "--model-def", model_def, "--data", "s3://data/digits",
                "--epochs", str(epochs), "--batch-size", "16", "--min-trainers", "1", "--max-trainers", str(max_t),
                "--trainers", str(trainers), "--checkpoint-uri", f"s3://ckpt/{self.ns}/{job}",
                "--checkpoint-interval", "2", "--namespace", self.ns, "--s3-secret", "minio",
                "--trainer-cpu", "1", "--trainer-memory", trainer_memory, "--sidecar-period", "1",
                "--sidecar-jitter", "0.2", "--summary-out", "/tmp/summary.json",
                "--image", self.plane.image("runtime"), "--trainer-image", self.plane.image(trainer_image), *extra]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "labels": {"workflows.argoproj.io/workflow": "wf", "test/step": job}},
               "spec": {"serviceAccountName": service_account, "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": grace_s,
                        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{"name": "main", "image": self.plane.image("runtime"), "command": ["edl"], "args": args,
                                        "env": identity_env(style), "securityContext": security(),
                                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                                      "limits": {"memory": "1Gi"}},
                                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]},
                                       keeper(self.plane.image("runtime"))],
                        "volumes": [{"name": "tmp", "emptyDir": {}}]}}
        named = extra[list(extra).index("--priority-class") + 1] if "--priority-class" in extra else None
        if named in PRIORITY_CLASSES:  # (a test of a class that does not exist wants the launcher to say so)
            # As the docs tell users: the step no lower than its trainers, or the scheduler takes it first.
            pod["spec"]["priorityClassName"] = named
        self.core.create_namespaced_pod(self.ns, pod)
        self.launched.append(name)
        return name

    # ------------------------------------------------------------ reading back
    def pod(self, name: str):
        try:
            return self.core.read_namespaced_pod(name, self.ns)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    @staticmethod
    def _main(p):
        """The ``main`` container's status in pod ``p`` (``None``: no pod, or not started)."""
        return next((cs for cs in (p.status.container_statuses or []) if cs.name == "main"), None) if p else None

    def exit_code(self, name: str) -> int | None:
        """How the step's ``main`` container ended; ``None`` while it has not."""
        cs = self._main(self.pod(name))
        return cs.state.terminated.exit_code if cs is not None and cs.state.terminated else None

    def running(self, name: str) -> bool:
        """The step's ``main`` container runs (its pod is not preempted, evicted or deleted)."""
        p = self.pod(name)
        cs = self._main(p)
        return cs is not None and cs.state.running is not None and not p.metadata.deletion_timestamp

    def failed(self, name: str) -> bool:
        return self.exit_code(name) not in (None, 0)

    def log(self, name: str) -> str:
        """The step's log: its ``main`` container's."""
        return self.log_of(name, "main")

    def log_of(self, name: str, container: str) -> str:
        try:
            return self.core.read_namespaced_pod_log(name, self.ns, container=container)
        except client.ApiException as e:
            return f"(no log: {e.status} {e.reason})"

    def wait_done(self, name: str, timeout: float = 240) -> int:
        """Wait for the step's ``main`` container to end; its exit code."""
        self.wait(lambda: self.exit_code(name) is not None, timeout, f"{name} to end")
        code = self.exit_code(name)
        assert code is not None
        return code

    def floored_model(self, job: str, step_floor_s: float) -> str:
        """The S3 URI of a model definition (``--model-def s3://...``, read by each trainer pod): the zoo's
        digits, each batch taking at least ``step_floor_s`` to collate, a floor under the job's length
        whatever the machine's speed, until ``full_speed`` lifts it once what the test watches has happened
        (the trainers look for the lift in S3 once a second)."""
        flag = f"s3://data/{self.ns}/{job}"
        source = f"""import time

from edl.storage.store import open_store
from edl.zoo.digits import loss, model, optimizer
from edl.zoo.digits import collate as _collate

_lift = open_store({flag!r}, "the floor's lift")
_floor = {{"on": True, "looked": 0.0}}


def collate(table):
    if _floor["on"]:
        if time.monotonic() - _floor["looked"] > 1.0:
            _floor["on"], _floor["looked"] = not _lift.exists("full-speed"), time.monotonic()
        if _floor["on"]:
            time.sleep({step_floor_s})
    return _collate(table)
""".encode()
        self.s3.client().put_object("data", f"{self.ns}/{job}/model.py", io.BytesIO(source), len(source))
        return f"s3://data/{self.ns}/{job}/model.py"

    def full_speed(self, job: str) -> None:
        """``floored_model``'s job trains on at its own speed."""
        self.s3.client().put_object("data", f"{self.ns}/{job}/full-speed", io.BytesIO(b""), 0)

    def summary(self, name: str) -> dict:
        """The run summary the launcher wrote into its /tmp (the step's output, read off its volume)."""
        import json

        p = self.pod(name)
        path = self.plane.pod_volume(p.spec.node_name, p.metadata.uid, "tmp") / "summary.json"
        return json.loads(path.read_text())

    def objects_of(self, job: str) -> list[str]:
        selector = f"edl.dev/job={job}"
        out = [f"pods/{p.metadata.name}" for p in self.core.list_namespaced_pod(self.ns, label_selector=selector).items]
        out += [f"services/{s.metadata.name}"
                for s in self.core.list_namespaced_service(self.ns, label_selector=selector).items]
        out += [f"secrets/{s.metadata.name}"
                for s in self.core.list_namespaced_secret(self.ns, label_selector=selector).items]
        out += [f"leases/{x.metadata.name}"
                for x in self.coord.list_namespaced_lease(self.ns, label_selector=selector).items]
        return out

    def wait_gone(self, job: str, timeout: float = 60, what: str = "every object of the job to go") -> None:
        try:
            self.wait(lambda: self.objects_of(job) == [], timeout, what)
        except AssertionError as e:
            raise AssertionError(f"{e}\nleft: {self.objects_of(job)}") from None

    def trainers(self, job: str, phase: str | None = "Running") -> list:
        pods = self.core.list_namespaced_pod(self.ns, label_selector=f"edl.dev/job={job},edl.dev/role=trainer").items
        return [p for p in pods if phase is None or (p.status.phase == phase and not p.metadata.deletion_timestamp)]

    def master(self, job: str, state: str = "serving"):
        """The job's master pod in ``state`` (``edl.dev/master``: serving, or the spare's standby) that is
        Running and Ready, not being deleted; ``None`` while there is none."""
        pods = self.core.list_namespaced_pod(
            self.ns, label_selector=f"edl.dev/job={job},edl.dev/role=master,edl.dev/master={state}").items
        return next((p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
                     and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])), None)

    def events(self, involved: str | None = None) -> list[str]:
        evs = self.core.list_namespaced_event(self.ns).items
        return [e.reason for e in evs if involved is None or e.involved_object.name == involved]

    def wait(self, pred, timeout: float = 120, what: str = "condition"):
        return wait_for(pred, timeout, what, every=0.3, detail=self.log_tail)

    def log_tail(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)[-2500:]}" for n in self.launched)

    def container_pid(self, pod_name: str, container: str = "main") -> int:
        pid = self.plane.container_pid(self.pod(pod_name), container)
        assert pid is not None, f"{pod_name}/{container} has no process"
        return pid

    def job_pids(self, job: str) -> dict[str, int]:
        """The processes of the job's running containers (``POD/CONTAINER`` -> pid), as their node knows them."""
        out = {}
        for p in self.core.list_namespaced_pod(self.ns, label_selector=f"edl.dev/job={job}").items:
            if not p.spec.node_name:
                continue
            for c in p.spec.containers:
                pid = self.plane.container_pid(p, c.name)
                if pid is not None:  # None: not started, or already ended
                    out[f"{p.metadata.name}/{c.name}"] = pid
        return out


def process_running(pid: int) -> bool:
    """``pid`` or a process of its group (a container's processes) is alive, not a zombie."""
    from pathlib import Path

    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if (int(stat.parent.name) == pid or int(fields[2]) == pid) and fields[0] not in ("Z", "X"):
            return True
    return False
