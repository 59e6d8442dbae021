"""``edl launch`` as a workflow step's pod on the real control plane (``tests/plane``).

The launcher runs in a pod under the ``edl-launcher`` ServiceAccount (RBAC and the restricted
PodSecurity profile enforced), creates the master pod (with its autoscale sidecar) and the
trainer pods through the real apiserver; the real scheduler binds them, the controller-manager
garbage-collects and evicts; our loopback kubelet runs them as processes. Data and checkpoints
live on MinIO. A test that shows edl wrong on a real cluster is a strict xfail naming the
defect (``../shared/design/review-real-home.md``), for the issue that fixes it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from kubernetes import client

from tests.plane.steps import Steps, process_running

pytestmark = pytest.mark.timeout(360)


@pytest.fixture
def steps(plane, kube, namespace):
    return Steps(plane, kube, namespace)


def test_launch_as_a_step_runs_the_job_grows_it_and_leaves_nothing_behind(steps):
    step = steps.launch("mnist", epochs=20)
    assert steps.wait_done(step) == 0, steps.log_tail()
    s = steps.summary(step)
    assert s["status"] == "succeeded" and s["epochs_completed"] == 20 and s["trainer_failures"] == 0
    assert max(g["world_size"] for g in s["generations"]) == 2  # the sidecar grew it into the idle nodes
    assert steps.objects_of("mnist") == []  # pods, service, token secret, demand lease: all removed
    assert {"JobCreated", "ScaleUp", "JobSucceeded"} <= set(steps.events(step))
    log = steps.log(step)
    assert "generation" in log and "succeeded" in log


def test_the_launcher_pod_deleted_takes_a_last_checkpoint_and_removes_every_object(steps):
    step = steps.launch("cancel", epochs=400)
    steps.wait(lambda: steps.trainers("cancel"), what="a running trainer")
    steps.wait(lambda: "generation 1" in steps.log(step), what="training")
    steps.core.delete_namespaced_pod(step, steps.ns)  # KFP/Argo terminate: SIGTERM, then the grace period
    steps.wait(lambda: steps.pod(step) is None, 60, "the launcher pod to go")
    steps.wait_gone("cancel", 30, "every object of the job to go")
    assert "JobCancelled" in steps.events(step)


def test_a_kfp_step_killed_without_cleanup_leaves_nothing_running(steps):
    step = steps.launch("kfpkill", epochs=400, style="kfp")
    steps.wait(lambda: steps.trainers("kfpkill"), what="a running trainer")
    pids = steps.job_pids("kfpkill")
    steps.core.delete_namespaced_pod(step, steps.ns, grace_period_seconds=0)  # no time for any cleanup
    killed = time.monotonic()
    steps.wait_gone("kfpkill", 30, "the garbage collector to remove the job")
    steps.wait(lambda: not [k for k, pid in pids.items() if process_running(pid)],
               max(1.0, 90 - (time.monotonic() - killed)), "no process of the job 90 s after the step was deleted")


def test_an_argo_step_killed_without_cleanup_is_garbage_collected(steps):
    step = steps.launch("argokill", epochs=400)
    steps.wait(lambda: steps.trainers("argokill"), what="a running trainer")
    steps.core.delete_namespaced_pod(step, steps.ns, grace_period_seconds=0)
    steps.wait_gone("argokill", 30, "the garbage collector to remove the job")


def test_the_apiserver_away_for_20_s_mid_run_holds_the_plan_and_the_job_finishes(steps):
    step = steps.launch("apiaway", epochs=40)
    steps.wait(lambda: steps.trainers("apiaway"), what="a running trainer")
    steps.wait(lambda: "generation 1" in steps.log(step), what="training")
    steps.plane.stop_apiserver()  # an upgrade, an etcd leader change: the API is away, the pods run on
    try:
        time.sleep(20)
    finally:
        steps.plane.start_apiserver()
    assert steps.wait_done(step, 300) == 0, steps.log_tail()
    s = steps.summary(step)
    assert s["status"] == "succeeded" and s["epochs_completed"] == 40 and s["master_restarts"] == 0
    log = steps.log(step)
    assert log.count("cluster API away") == 1 and "holding the plan" in log, log
    assert log.count("cluster API back") == 1, log
    steps.wait_gone("apiaway", 60, "cleanup")


def test_a_master_that_rejects_its_data_fails_the_step_fast_with_its_own_reason(steps):
    started = time.monotonic()
    step = steps.launch("nodata", "--data", "s3://data/no-such-set", epochs=3)
    code = steps.wait_done(step, 90)
    took = time.monotonic() - started
    log = steps.log(step)
    assert code == 2 and took < 75, (code, took, log)
    assert "s3://data/no-such-set" in log and "did not answer" not in log, log  # its reason, not a timeout
    steps.wait_gone("nodata", 60, "cleanup")


def test_an_unknown_trainer_image_fails_the_step_fast_naming_the_image(steps):
    started = time.monotonic()
    step = steps.launch("noimage", "--trainer-image", "registry.example/no-such-trainer:9", epochs=3)
    code = steps.wait_done(step, 120)
    log = steps.log(step)
    assert code == 2 and time.monotonic() - started < 90, (code, log)
    assert "image 'registry.example/no-such-trainer:9' cannot be pulled" in log, log
    steps.wait_gone("noimage", 60, "cleanup")


def test_a_retried_launcher_adopts_the_job_and_a_lost_master_is_recreated(steps):
    first = steps.launch("adopt", epochs=60)
    steps.wait(lambda: steps.trainers("adopt"), what="a running trainer")
    master_uid = steps.pod("edl-adopt-master").metadata.uid
    os.kill(steps.container_pid(first), signal.SIGKILL)  # the step's container died; its retry is a new pod
    steps.wait(lambda: steps.phase(first) == "Failed", 30, "the first step to fail")
    second = steps.launch("adopt", epochs=60)
    steps.wait(lambda: "adopted the existing job" in steps.log(second), what="adoption")
    assert steps.pod("edl-adopt-master").metadata.uid == master_uid  # not a second job
    steps.core.delete_namespaced_pod("edl-adopt-master", steps.ns)  # lost, as when its node is drained
    steps.wait(lambda: (p := steps.pod("edl-adopt-master")) is not None and p.metadata.uid != master_uid,
               90, "a new master pod")
    assert steps.wait_done(second, 300) == 0, steps.log_tail()
    s = steps.summary(second)
    assert s["status"] == "succeeded" and s["master_restarts"] >= 1
    assert steps.objects_of("adopt") == []


def test_a_launcher_killed_without_its_cleanup_leaves_no_pod_running_and_no_process(steps):
    """The step's container SIGKILLed and not retried: its pod stays (Failed), so the garbage collector
    does nothing. The dead-man switch does: the master, not beaten for 30 s, tells the trainers to leave,
    its sidecar and then itself exit 0, and nothing restarts them (restartPolicy OnFailure)."""
    step = steps.launch("deadman", epochs=400)
    steps.wait(lambda: steps.trainers("deadman"), what="a running trainer")
    steps.wait(lambda: "generation 1" in steps.log(step), what="training")
    pids = steps.job_pids("deadman")
    assert {"edl-deadman-master/master", "edl-deadman-master/autoscale-sidecar"} <= set(pids), pids
    os.kill(steps.container_pid(step), signal.SIGKILL)
    killed = time.monotonic()
    steps.wait(lambda: steps.phase(step) == "Failed", 30, "the step to fail")

    def running_pods() -> list[str]:
        pods = steps.core.list_namespaced_pod(steps.ns, label_selector="edl.dev/job=deadman").items
        return [f"{p.metadata.name}: {p.status.phase}" for p in pods if p.status.phase not in ("Succeeded", "Failed")]

    steps.wait(lambda: not running_pods(), max(1.0, 60 - (time.monotonic() - killed)),
               "no pod of the job running 60 s after the launcher died")
    pids.update(steps.job_pids("deadman"))  # a trainer started late, if any
    steps.wait(lambda: not [k for k, pid in pids.items() if process_running(pid)],
               max(1.0, 90 - (time.monotonic() - killed)), "no process of the job 90 s after the launcher died")
    master = steps.pod("edl-deadman-master")
    assert master.status.phase == "Succeeded", master.status
    assert all(cs.restart_count == 0 for cs in master.status.container_statuses)
    assert all(t.status.phase == "Succeeded" for t in steps.trainers("deadman", phase=None))
    assert "launcher silent for 30 s: ending job deadman" in steps.log_of("edl-deadman-master", "master")


def test_a_retried_step_keeps_its_job_when_the_first_pod_is_cleaned_up(steps):
    first = steps.launch("reown", epochs=20)
    steps.wait(lambda: steps.trainers("reown"), what="a running trainer")
    os.kill(steps.container_pid(first), signal.SIGKILL)
    steps.wait(lambda: steps.phase(first) == "Failed", 30, "the first step to fail")
    second = steps.launch("reown", epochs=20)
    steps.wait(lambda: "adopted the existing job" in steps.log(second), what="adoption")
    master_uid = steps.pod("edl-reown-master").metadata.uid
    steps.core.delete_namespaced_pod(first, steps.ns)  # the workflow's pod GC removes the failed pod
    steps.wait(lambda: steps.pod(first) is None, 30, "the first pod to go")
    time.sleep(10)  # the garbage collector acts within a second or two of its owner going
    master = steps.pod("edl-reown-master")
    assert master is not None and master.metadata.uid == master_uid and not master.metadata.deletion_timestamp
    assert "secrets/edl-reown-token" in steps.objects_of("reown")
    assert steps.wait_done(second, 150) == 0, steps.log_tail()
    assert steps.summary(second)["master_restarts"] == 0


def test_an_evicted_trainer_is_replaced(steps):
    step = steps.launch("evict", epochs=400, max_t=1)
    steps.wait(lambda: steps.trainers("evict"), what="a running trainer")
    steps.wait(lambda: "generation 1" in steps.log(step), what="training")
    victim = steps.trainers("evict")[0]
    # The trainer's /tmp (an emptyDir of 1Gi) overflows: the kubelet evicts the pod.
    tmp = steps.plane.pod_volume(victim.spec.node_name, victim.metadata.uid, "tmp")
    with (tmp / "fill").open("wb") as f:
        for _ in range(1100):
            f.write(b"\0" * 2**20)
    steps.wait(lambda: [t for t in steps.trainers("evict") if t.metadata.name != victim.metadata.name],
               90, "a replacement trainer")
    steps.wait(lambda: "generation 2" in steps.log(step), 90, "the replacement training")
    assert "replacing it" in steps.log(step)
    steps.core.delete_namespaced_pod(step, steps.ns)
    steps.wait_gone("evict", 90, "cleanup")


def test_an_oom_killed_trainer_fails_the_job_naming_the_limit(steps):
    step = steps.launch("oom", epochs=400, max_t=1, trainer_memory="200Mi")
    assert steps.wait_done(step, 180) != 0
    log = steps.log(step)
    assert "OOMKilled" in log and "memory limit 200Mi" in log and "--trainer-memory" in log, log
    steps.wait_gone("oom", 60, "cleanup")


def test_trainers_that_fit_no_node_are_reported_unschedulable(steps):
    step = steps.launch("stuck", "--pending-timeout", "3", "--trainer-cpu", "6", epochs=400, max_t=2, trainers=2)
    steps.wait(lambda: "unschedulable" in steps.log(step), 120, "an unschedulable report")
    assert "TrainersUnschedulable" in steps.events()
    pending = steps.trainers("stuck", phase="Pending")
    assert all(any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or [])
               for p in pending)  # the real scheduler's verdict
    steps.core.delete_namespaced_pod(step, steps.ns)
    steps.wait_gone("stuck", 60, "cleanup")


def test_a_missing_s3_secret_or_priority_class_fails_before_any_pod_is_created(steps):
    step = steps.launch("nosecret", "--s3-secret", "does-not-exist")
    assert steps.wait_done(step, 90) == 2
    log = steps.log(step)
    assert "does-not-exist" in log and "Traceback" not in log, log
    assert steps.objects_of("nosecret") == []
    step = steps.launch("noclass", "--priority-class", "gold")
    assert steps.wait_done(step, 90) == 2
    log = steps.log(step)
    assert "--priority-class 'gold'" in log and "Traceback" not in log, log
    assert steps.objects_of("noclass") == []


def test_a_higher_priority_service_takes_the_capacity_back(steps, kube):
    """The job grows into both nodes at low priority; a high-priority Deployment that needs most of
    the cluster gets it (the sidecar hands trainers back, the scheduler preempts what is left), and
    the job carries on with fewer trainers."""
    step = steps.launch("yield", "--priority-class", "edl-low", "--trainer-cpu", "1.5", epochs=400, max_t=4)
    steps.wait(lambda: len(steps.trainers("yield")) >= 3, 180, "growth to 3+ trainers")
    apps = client.AppsV1Api(kube)
    web = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
           "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                        "priorityClassName": "edl-high", "terminationGracePeriodSeconds": 2,
                        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{"name": "web", "image": "edl-runtime:0.1.0", "command": ["sleep", "3600"],
                                        "securityContext": {"allowPrivilegeEscalation": False,
                                                            "capabilities": {"drop": ["ALL"]}, "runAsUser": 10001},
                                        "resources": {"requests": {"cpu": "2", "memory": "64Mi"}}}]}}}}
    apps.create_namespaced_deployment(steps.ns, web)
    steps.wait(lambda: (d := apps.read_namespaced_deployment("web", steps.ns)).status.ready_replicas == 2 and d,
               120, "the service's two replicas Ready")
    steps.wait(lambda: 1 <= len(steps.trainers("yield")) <= 2, 60, "the job down to what is left")
    assert steps.phase(step) == "Running"
    steps.core.delete_namespaced_pod(step, steps.ns)
    steps.wait_gone("yield", 90, "cleanup")
