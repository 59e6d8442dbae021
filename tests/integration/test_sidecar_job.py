"""``edl sidecar`` as a process: Kubernetes view from FakeKubeApiServer (a test double), a real job.

The job is a real ``edl train`` (master, Paddle trainers); the sidecar watches the
double's nodes and pods, publishes its Lease, runs the policy and sets the
master's desired count, which the local launcher follows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import yaml

from edl.autoscale.sidecar import demand_from_lease
from tests.conftest import edl_cmd
from tests.kube_double import TOKEN, FakeKubeApiServer

pytestmark = pytest.mark.timeout(240)


def kubeconfig(path, url: str) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "double",
        "clusters": [{"name": "double", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}],
        "contexts": [{"name": "double", "context": {"cluster": "double", "user": "u", "namespace": "ml"}}]}))
    return str(path)


def start_sidecar(job, cfg: str, log_path, period="0.5"):
    info = job.info()
    log = log_path.open("wb")
    return subprocess.Popen(
        edl_cmd("sidecar", "--job-name", job.name, "--master", info["address"], "--namespace", "ml",
                "--period", period, "--jitter", "0.1", "--min-trainers", "1", "--max-trainers", "3",
                "--trainer-cpu", "2", "--trainer-memory", "1Gi", "--kubeconfig", cfg),
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "EDL_TOKEN": info["token"], "POD_NAME": "master-0"})


def stop(proc) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("sidecar did not stop on SIGTERM") from None


def job_args(digits, tmp_path):
    return ["--model-def", "edl.zoo.digits", "--data", str(digits), "--epochs", "400", "--batch-size", "16",
            "--min-trainers", "1", "--max-trainers", "3", "--trainers", "1",
            "--checkpoint-uri", str(tmp_path / "ckpt"), "--checkpoint-interval", "5"]


def test_sidecar_grows_into_idle_capacity_and_hands_it_back(digits, tmp_path, job_runner):
    with FakeKubeApiServer() as api:
        api.add_node("n0", cpu="8", memory="32Gi")
        cfg = kubeconfig(tmp_path / "kubeconfig", api.url)
        job = job_runner("sc", job_args(digits, tmp_path)).start()
        job.wait_for(lambda s: s["world_size"] == 1, what="one trainer training")
        sidecar = start_sidecar(job, cfg, tmp_path / "sidecar.log")
        try:
            # 8 idle cores, 2 per trainer: the job grows to its max of 3.
            job.wait_for(lambda s: s["desired_trainers"] == 3 and s["world_size"] == 3, timeout=120,
                         what="growth to 3 trainers")
            leases = api.objects("leases", "ml")
            assert [ls["metadata"]["name"] for ls in leases] == ["edl-sc-demand"]
            d = demand_from_lease(leases[0], time.time())
            assert (d.name, d.min, d.max, d.trainer.cpu) == ("ml/sc", 1, 3, 2.0)
            # A higher-priority service needs 6 of the 8 cores: the job shrinks within a period.
            api.store.put("pods", {"metadata": {"name": "web-0", "namespace": "web"},
                                   "spec": {"priority": 1000, "containers": [
                                       {"name": "c", "resources": {"requests": {"cpu": "6", "memory": "1Gi"}}}]},
                                   "status": {"phase": "Pending"}})
            t0 = time.monotonic()
            job.wait_for(lambda s: s["desired_trainers"] == 1, timeout=30, what="hand-back to 1 trainer")
            assert time.monotonic() - t0 < 5  # one 0.5 s period plus the watch latency, with margin
            job.wait_for(lambda s: s["world_size"] == 1, timeout=60, what="the drain to finish")
        finally:
            code = stop(sidecar)
        out = (tmp_path / "sidecar.log").read_text()
        assert code == 0, out
        assert "scale sc" not in out and "scale ml/sc: 1 -> 3 trainers" in out and "3 -> 1" in out


def test_sidecar_holds_the_size_when_the_api_is_unreachable(digits, tmp_path, job_runner):
    cfg = kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1")  # nothing listens there
    job = job_runner("hold", job_args(digits, tmp_path)).start()
    job.wait_for(lambda s: s["world_size"] == 1, what="one trainer training")
    sidecar = start_sidecar(job, cfg, tmp_path / "sidecar.log")
    try:
        time.sleep(4)
        assert sidecar.poll() is None  # still running, retrying
        assert job.status()["desired_trainers"] == 1
    finally:
        code = stop(sidecar)
    out = (tmp_path / "sidecar.log").read_text()
    assert code == 0 and "holding 1 trainers" in out, out
