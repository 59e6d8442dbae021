"""``edl launch`` against FakeKubeApiServer + LoopbackKubelet (TEST DOUBLES: this machine has no cluster).

Everything else is real: the launcher process, the master and sidecar containers
and the Paddle trainers run as processes, data and checkpoints live on a real
S3 endpoint (moto's server) reached through minio, and the sidecar watches the
double's API. The same scenarios run against a real cluster in tests/e2e.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time

import pytest
import yaml

from tests.conftest import edl_cmd, run_edl
from tests.kube_double import TOKEN, FakeKubeApiServer, LoopbackKubelet

pytestmark = pytest.mark.timeout(300)
NS = "ml"


class KubeWorld:
    """A double of a cluster with one 16-core node, an S3 secret, and a launcher 'pod'."""

    def __init__(self, tmp_path, s3, admit=lambda pod: True) -> None:
        self.tmp = tmp_path
        self.api = FakeKubeApiServer().__enter__()
        self.api.add_node("node-0", cpu="16", memory="64Gi")
        self.kubeconfig = tmp_path / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "d",
            "clusters": [{"name": "d", "cluster": {"server": self.api.url}}],
            "users": [{"name": "u", "user": {"token": TOKEN}}],
            "contexts": [{"name": "d", "context": {"cluster": "d", "user": "u", "namespace": NS}}]}))
        self.api.store.put("secrets", {"apiVersion": "v1", "kind": "Secret",
                                       "metadata": {"name": "minio", "namespace": NS},
                                       "data": {k: base64.b64encode(v.encode()).decode() for k, v in s3.env.items()}})
        self.launcher_pod = self.api.store.put("pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "step-launcher", "namespace": NS},
            "spec": {"nodeName": "node-0", "containers": [{"name": "main", "image": "x"}]},
            "status": {"phase": "Running"}})
        (tmp_path / "pods").mkdir()
        self.kubelet = LoopbackKubelet(self.api, str(self.kubeconfig), tmp_path / "pods",
                                       admit=lambda pod: pod["metadata"]["name"] != "step-launcher" and admit(pod))
        self.kubelet.__enter__()
        self.procs: list[subprocess.Popen] = []

    def launch(self, job: str, *extra: str, epochs: int = 3, max_t: int = 2, trainers: int = 1) -> subprocess.Popen:
        log = (self.tmp / f"launch-{job}-{len(self.procs)}.log").open("wb")
        env = {**os.environ, "POD_NAME": "step-launcher", "POD_UID": self.launcher_pod["metadata"]["uid"]}
        p = subprocess.Popen(edl_cmd(
            "launch", "--job-name", job, "--model-def", "edl.zoo.digits", "--data", "s3://data/digits",
            "--epochs", str(epochs), "--batch-size", "16", "--min-trainers", "1", "--max-trainers", str(max_t),
            "--trainers", str(trainers), "--checkpoint-uri", f"s3://ckpt/{job}", "--checkpoint-interval", "2",
            "--namespace", NS, "--s3-secret", "minio", "--trainer-cpu", "1", "--trainer-memory", "1Gi",
            "--sidecar-period", "1", "--sidecar-jitter", "0.2", "--kubeconfig", str(self.kubeconfig),
            "--master-via", "pod-ip", "--summary-out", str(self.tmp / f"{job}-summary.json"), *extra),
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(p)
        return p

    def log(self, job: str, k: int = 0) -> str:
        return (self.tmp / f"launch-{job}-{k}.log").read_text(errors="replace")

    def objects_of(self, job: str) -> list[str]:
        out = []
        for res in ("pods", "services", "secrets", "leases"):
            out += [f"{res}/{o['metadata']['name']}" for o in self.api.objects(res, NS, f"edl.dev/job={job}")]
        return out

    def trainers(self, job: str, phase: str | None = "Running") -> list[dict]:
        pods = self.api.objects("pods", NS, f"edl.dev/job={job},edl.dev/role=trainer")
        return [p for p in pods if phase is None or (p.get("status") or {}).get("phase") == phase]

    def wait(self, pred, timeout=120.0, what="condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = pred()
            if v:
                return v
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}\n{self.log_tail()}")

    def log_tail(self) -> str:
        logs = sorted(self.tmp.glob("launch-*.log"))
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in logs)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.kubelet.__exit__(None, None, None)
        self.api.__exit__(None, None, None)


@pytest.fixture
def world(tmp_path, s3):
    r = run_edl("data", "prepare", "digits", "--out", "s3://data/digits")
    assert r.returncode == 0, r.stderr
    w = KubeWorld(tmp_path, s3)
    yield w
    w.close()


def test_launch_runs_the_job_grows_it_and_leaves_nothing_behind(world):
    p = world.launch("mnist", epochs=20)
    assert p.wait(240) == 0, world.log("mnist")
    s = json.loads((world.tmp / "mnist-summary.json").read_text())
    assert s["status"] == "succeeded" and s["epochs_completed"] == 20 and s["trainer_failures"] == 0
    assert max(g["world_size"] for g in s["generations"]) == 2  # the sidecar grew it into the idle node
    assert world.objects_of("mnist") == []  # pods, service, token secret, demand lease: all removed
    events = {e["reason"] for e in world.api.objects("events", NS)
              if e["involvedObject"]["name"] == "step-launcher"}
    assert {"JobCreated", "ScaleUp", "JobSucceeded"} <= events
    owned = [r for (m, r) in world.api.store.requests if m == "POST" and "/pods" in r]
    assert owned  # trainers and master were created through the API
    log = world.log("mnist")
    assert "generation" in log and "succeeded" in log


def test_sigterm_takes_a_last_checkpoint_and_removes_every_object(world):
    p = world.launch("cancel", epochs=400)
    world.wait(lambda: len(world.trainers("cancel")) >= 1, what="a running trainer")
    world.wait(lambda: "generation 1" in world.log("cancel"), what="training")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    code = p.wait(30)
    took = time.monotonic() - t0
    assert code == 143, world.log("cancel")
    assert took < 25, took
    assert world.objects_of("cancel") == []
    assert "last checkpoint" in world.log("cancel")
    reasons = [e["reason"] for e in world.api.objects("events", NS)]
    assert "JobCancelled" in reasons


def test_a_retried_launcher_adopts_the_job_and_a_lost_master_is_recreated(world):
    first = world.launch("adopt", epochs=60)
    world.wait(lambda: len(world.trainers("adopt")) >= 1, what="a running trainer")
    master_uid = world.api.pod(NS, "edl-adopt-master")["metadata"]["uid"]
    os.killpg(first.pid, signal.SIGKILL)  # the step's pod died; its retry runs the same command
    first.wait()
    second = world.launch("adopt", epochs=60)
    world.wait(lambda: "adopted the existing job" in world.log("adopt", 1), what="adoption")
    assert world.api.pod(NS, "edl-adopt-master")["metadata"]["uid"] == master_uid  # not a second job
    # Now the master pod is lost (deleted, as when its node goes away): the launcher recreates it.
    world.api.store.remove("pods", NS, "edl-adopt-master")
    world.wait(lambda: (world.api.pod(NS, "edl-adopt-master") or {"metadata": {"uid": master_uid}})
               ["metadata"]["uid"] != master_uid, what="a new master pod")
    assert second.wait(240) == 0, world.log("adopt", 1)
    s = json.loads((world.tmp / "adopt-summary.json").read_text())
    assert s["status"] == "succeeded" and s["master_restarts"] >= 1
    assert world.objects_of("adopt") == []


def test_an_evicted_trainer_is_replaced_and_an_oom_fails_the_job_naming_the_limit(world):
    p = world.launch("evict", epochs=400, max_t=1)
    world.wait(lambda: world.trainers("evict"), what="a running trainer")
    world.wait(lambda: "generation 1" in world.log("evict"), what="training")
    victim = world.trainers("evict")[0]["metadata"]["name"]
    world.kubelet.evict(NS, victim)
    world.wait(lambda: [t for t in world.trainers("evict") if t["metadata"]["name"] != victim],
               what="a replacement trainer")
    assert "replacing it" in world.log("evict") and "failed" not in world.log("evict").split("replacing it")[0][-300:]
    world.wait(lambda: "generation 2" in world.log("evict"), what="the replacement training")
    world.kubelet.oom_kill(NS, world.trainers("evict")[0]["metadata"]["name"])
    assert p.wait(60) != 0
    log = world.log("evict")
    assert "OOMKilled" in log and "memory limit 1Gi" in log and "--trainer-memory" in log
    assert world.objects_of("evict") == []


def test_trainers_pending_too_long_are_removed_and_reported(tmp_path, s3):
    r = run_edl("data", "prepare", "digits", "--out", "s3://data/digits")
    assert r.returncode == 0, r.stderr
    # Only the master and the first trainer fit: every later trainer pod stays Pending.
    admitted: set[str] = set()

    def admit(pod):
        name = pod["metadata"]["name"]
        if name.endswith("-master"):
            return True
        if not admitted or name in admitted:
            admitted.add(name)
            return True
        return False

    world = KubeWorld(tmp_path, s3, admit=admit)
    try:
        p = world.launch("stuck", "--pending-timeout", "3", epochs=400, max_t=3)
        world.wait(lambda: "unschedulable" in world.log("stuck"), timeout=90, what="an unschedulable report")
        world.wait(lambda: not world.trainers("stuck", "Pending"), what="pending pods removed")
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 143
        assert "TrainersUnschedulable" in [e["reason"] for e in world.api.objects("events", NS)]
    finally:
        world.close()


def test_a_missing_s3_secret_or_priority_class_fails_before_any_pod_is_created(world):
    p = world.launch("nosecret", "--s3-secret", "does-not-exist")
    assert p.wait(60) == 2
    log = world.log("nosecret")
    assert "does-not-exist" in log and "Traceback" not in log
    assert world.objects_of("nosecret") == []
    p = world.launch("noclass", "--priority-class", "gold")
    assert p.wait(60) == 2
    log = world.log("noclass", 1)
    assert "--priority-class 'gold'" in log and "Traceback" not in log
    assert world.objects_of("noclass") == []
