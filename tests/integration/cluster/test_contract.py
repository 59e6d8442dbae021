"""One contract for every ``Cluster`` (``edl.api.cluster``): the launcher's logic assumes it of each.

The same tests run against the three implementations: ``SimCluster`` (the simulator, in virtual
time), ``LocalCluster`` (real processes: a real master and real trainers on this machine) and
``KubeCluster`` (pods on the real control plane of ``tests/plane``, run by its kubelet).
What a backend must do: create a job once and adopt it after (same address and token), list the
trainers it was asked for, delete idempotently, replace a lost master, record without failing.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Callable

import pytest

from edl.api.cluster import Cluster, PodPhase
from edl.api.spec import JobSpec, K8sOptions
from tests.waits import wait_for

pytestmark = pytest.mark.timeout(240)
# No launcher beats these masters (the tests drive the Cluster themselves): a dead-man switch
# (edl.master.deadman) longer than any test, so that none ends itself midway.
NO_LAUNCHER_S = 600.0

SCENARIO = {
    "name": "contract", "duration_s": 100000, "period_s": 5, "preemption": True,
    "nodes": [{"count": 2, "cpu": 8, "memory_gi": 32}],
    "priorities": {"batch": 0}, "services": [],
    "jobs": [{"name": "contract", "count": 1, "submit_at": 0, "priority": "batch", "fixed_pods": [],
              "trainer": {"cpu": 2, "memory_gi": 2}, "min": 1, "max": 4, "static": 1, "work": 5_000_000,
              "throughput": {"per_trainer": 100, "efficiency": 0.97}, "rescale_cost_s": 1, "startup_s": 2,
              "drain_s": 1}],
}


@dataclass
class Backend:
    cluster: Cluster
    prefix: str  # trainer names the backend's job owns
    settle: Callable[[Callable[[], object], float, str], object]  # wait (or advance virtual time) until true
    lose_master: Callable[[], None]  # the master dies from outside (a crash, a node drained)


def _sim(request) -> Backend:
    from edl.sim.backend import SimCluster, VirtualDriver
    from edl.sim.engine import Simulation
    from edl.sim.scenario import parse

    sim = Simulation(parse(SCENARIO), "edl", external=frozenset({"contract"}))
    cluster = SimCluster(sim, "contract")
    driver = VirtualDriver(sim, None)

    def settle(pred, timeout, what):
        end = sim.now + timeout
        while sim.now <= end:
            if (v := pred()):
                return v
            driver.sleep(1.0)
        raise AssertionError(f"{what}: not within {timeout} virtual seconds")

    def lose_master():
        for p in list(sim.by_owner.get("contract", {}).values()):
            if p.role == "master":
                sim._delete(p)

    return Backend(cluster, cluster.trainer_prefix, settle, lose_master)


def _local(request) -> Backend:
    from edl.cluster.local import LocalCluster

    digits, tmp = request.getfixturevalue("digits"), request.getfixturevalue("tmp_path")
    spec = JobSpec(job="contract", model_def="edl.zoo.digits", data=str(digits), epochs=200, batch_size=16,
                   min_trainers=1, max_trainers=4, trainers=1, checkpoint_uri=str(tmp / "ckpt"),
                   launcher_timeout_s=NO_LAUNCHER_S)
    cluster = LocalCluster(spec, tmp / "job", {**os.environ, "PYTHONUNBUFFERED": "1"})
    request.addfinalizer(cluster.delete_job)

    def lose_master():
        assert cluster.master is not None
        os.kill(cluster.master.pid, signal.SIGKILL)
        assert cluster.master.wait(10)

    def settle(pred, timeout, what):
        return wait_for(pred, timeout, what)

    return Backend(cluster, "contract-trainer-", settle, lose_master)


def _kube(request) -> Backend:
    from edl.cluster.kube_cluster import KubeCluster
    from edl.cluster.kube_api import KubeApi

    kube, ns = request.getfixturevalue("kube"), request.getfixturevalue("namespace")
    spec = JobSpec(job="contract", model_def="edl.zoo.digits", data="s3://data/digits", epochs=200, batch_size=16,
                   min_trainers=1, max_trainers=4, trainers=1, checkpoint_uri=f"s3://ckpt/{ns}/contract",
                   launcher_timeout_s=NO_LAUNCHER_S)
    plane = request.getfixturevalue("plane")
    opts = K8sOptions(namespace=ns, s3_secret="minio", trainer_cpu="1", trainer_memory="1Gi",
                      image=plane.image("runtime"), trainer_image=plane.image("trainer-cpu"))
    api = KubeApi(kube, ns)
    cluster = KubeCluster(api, spec, opts, owner=None, master_via="pod-ip")
    request.addfinalizer(cluster.delete_job)

    def lose_master():
        api.delete("pods", cluster.names["master"], grace_s=0)

    def settle(pred, timeout, what):
        return wait_for(pred, timeout, what)

    return Backend(cluster, cluster.trainer_prefix, settle, lose_master)


@pytest.fixture(params=["sim", "local", "kube"])
def backend(request) -> Backend:
    return {"sim": _sim, "local": _local, "kube": _kube}[request.param](request)


def names(b: Backend) -> set[str]:
    return {t.name for t in b.cluster.trainers()}


def test_a_job_is_created_once_and_adopted_after(backend):
    first = backend.cluster.ensure_job()
    assert not first.adopted
    backend.settle(backend.cluster.master_alive, 120, "the master to run")
    again = backend.cluster.ensure_job()
    assert again.adopted and (again.address, again.token) == (first.address, first.token)
    assert backend.cluster.master_alive()


def test_trainers_are_listed_as_asked_and_deletes_are_idempotent(backend):
    backend.cluster.ensure_job()
    a, b = f"{backend.prefix}0", f"{backend.prefix}1"
    backend.cluster.create_trainer(a)
    backend.cluster.create_trainer(b)
    backend.settle(lambda: names(backend) == {a, b}, 60, "both trainers listed")
    listed = {t.name: t for t in backend.cluster.trainers()}
    assert all(not t.phase.terminated and t.exit is None for t in listed.values())
    assert listed[b].created_at >= listed[a].created_at
    backend.settle(lambda: any(t.phase is PodPhase.RUNNING for t in backend.cluster.trainers()), 120,
                   "a trainer running")
    backend.cluster.delete_trainer(a)
    backend.settle(lambda: a not in names(backend), 60, f"{a} gone")
    backend.cluster.delete_trainer(a)  # again: gone is fine
    backend.cluster.delete_trainer(f"{backend.prefix}never")  # never existed: fine
    assert names(backend) == {b}


def test_a_lost_master_is_replaced(backend):
    first = backend.cluster.ensure_job()
    backend.settle(backend.cluster.master_alive, 120, "the master to run")
    backend.lose_master()
    backend.settle(lambda: not backend.cluster.master_alive(), 60, "the master to be seen lost")
    successor = backend.cluster.recreate_master()
    backend.settle(backend.cluster.master_alive, 120, "the new master to run")
    again = backend.cluster.ensure_job()
    assert again.adopted and again.token == first.token
    assert again.address == successor  # where the successor answers (pod-ip: its own pod's IP)


def test_delete_job_removes_everything_and_is_idempotent(backend):
    backend.cluster.ensure_job()
    backend.cluster.create_trainer(f"{backend.prefix}0")
    backend.settle(lambda: names(backend), 60, "the trainer listed")
    backend.cluster.record("ContractTest", "an event")
    backend.cluster.record("ContractTest", "a warning", warning=True)
    backend.cluster.delete_job()
    backend.settle(lambda: not backend.cluster.master_alive() and not backend.cluster.trainers(), 60,
                   "every pod of the job gone")
    backend.cluster.delete_job()  # again: nothing left is fine
