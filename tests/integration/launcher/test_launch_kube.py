"""``edl launch`` as a workflow step's pod on the real control plane (``tests/plane``).

The launcher runs in a pod under the ``edl-launcher`` ServiceAccount (RBAC and the restricted
PodSecurity profile enforced), creates the master pod and the
trainer pods through the real apiserver; the real scheduler binds them, the controller-manager
garbage-collects and evicts; each node's kubelet runs them under containerd and runc. Data and checkpoints
live on MinIO. A test that shows edl wrong on a real cluster is a strict xfail naming the
defect (``../shared/design/review-real-home.md``), for the issue that fixes it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.utils.quantity import parse_quantity

from edl.cluster.manifests import preferred_node
from tests.conftest import run_edl
from tests.plane.steps import Steps, process_running

pytestmark = pytest.mark.timeout(360)


@pytest.fixture
def steps(plane, kube, namespace, plane_s3):
    return Steps(plane, kube, namespace, plane_s3)


def test_launch_as_a_step_runs_the_job_grows_it_and_leaves_nothing_behind(steps):
    step = steps.launch("mnist", epochs=20)
    # Its trainers run our trainer image from the plane's registry, as uid 10001, the root read-only.
    trainer = steps.wait(lambda: (t := steps.trainers("mnist")) and t[0], what="a running trainer")
    [main] = trainer.spec.containers
    assert main.image == steps.plane.image("trainer-cpu")
    assert main.security_context.read_only_root_filesystem and main.security_context.run_as_user == 10001
    assert {m.mount_path for m in main.volume_mounts} >= {"/tmp"}
    assert trainer.status.container_statuses[0].image_id.startswith(main.image.rsplit(":", 1)[0] + "@sha256:")
    assert steps.wait_done(step) == 0, steps.log_tail()
    s = steps.summary(step)
    assert s["status"] == "succeeded" and s["epochs_completed"] == 20 and s["trainer_failures"] == 0
    assert max(g["world_size"] for g in s["generations"]) == 2  # the sidecar grew it into the idle nodes
    assert steps.objects_of("mnist") == []  # pods, service, token secret, demand lease: all removed
    assert {"JobCreated", "ScaleUp", "JobSucceeded"} <= set(steps.events(step))
    log = steps.log(step)
    assert "generation" in log and "succeeded" in log


@pytest.mark.timeout(600)  # the first unpacking of a 5.6 GB image on a fresh machine, beside the test
def test_a_pytorch_job_trains_in_edls_pytorch_image_audited_and_exports_onnx(steps, plane_s3):
    """The PyTorch trainer image (images/trainer-torch-gpu: PyPI's CUDA build, on CPUs with Gloo
    here) runs a PyTorch model's trainers as pods: grown to 2, every sample once, ONNX exported."""
    # Pre-pulled as ./dev cluster does: the nodes take its layers (5.6 GB unpacked) from the machine's copy.
    steps.plane.prepull(("trainer-torch-gpu",), timeout_s=480)
    step = steps.launch("torchjob", "--audit", epochs=4, model_def="edl.zoo.torch.digits",
                        trainer_image="trainer-torch-gpu")
    trainer = steps.wait(lambda: (t := steps.trainers("torchjob")) and t[0], what="a running trainer")
    assert trainer.spec.containers[0].image == steps.plane.image("trainer-torch-gpu")
    assert steps.wait_done(step) == 0, steps.log_tail()
    s = steps.summary(step)
    assert s["status"] == "succeeded" and s["lost_samples"] == 0 and s["duplicate_samples"] == 0
    assert s["audited_samples_per_epoch"] == [1438] * 4 and max(g["world_size"] for g in s["generations"]) == 2
    prefix = s["final_model_uri"].removeprefix("s3://ckpt/")
    files = {o.object_name.rsplit("/", 1)[-1]
             for o in plane_s3.client().list_objects("ckpt", prefix + "/", recursive=True)}
    assert {"params.npz", "model.onnx", "model.pt2"} <= files, files
    steps.wait_gone("torchjob")


def test_the_launcher_pod_deleted_takes_a_last_checkpoint_and_removes_every_object(steps):
    step = steps.launch("cancel", epochs=400, step_floor_s=0.05)
    steps.wait(lambda: steps.trainers("cancel"), what="a running trainer")
    steps.wait(lambda: "generation 1" in steps.log(step), what="training")
    steps.core.delete_namespaced_pod(step, steps.ns)  # KFP/Argo terminate: SIGTERM, then the grace period
    steps.wait(lambda: steps.pod(step) is None, 60, "the launcher pod to go")
    steps.wait_gone("cancel", 30, "every object of the job to go")
    assert "JobCancelled" in steps.events(step)


def test_a_kfp_step_killed_without_cleanup_leaves_nothing_running(steps):
    step = steps.launch("kfpkill", epochs=400, step_floor_s=0.05, style="kfp")
    steps.wait(lambda: steps.trainers("kfpkill"), what="a running trainer")
    pids = steps.job_pids("kfpkill")
    steps.core.delete_namespaced_pod(step, steps.ns, grace_period_seconds=0)  # no time for any cleanup
    killed = time.monotonic()
    # The bound Operations gives (and the Argo test below waits): a trainer its kubelet's SIGTERM asks to
    # leave may wait up to 15 s for a switch its master, torn down too, never makes (30-s grace period).
    steps.wait_gone("kfpkill", 60, "the garbage collector to remove the job")
    steps.wait(lambda: not [k for k, pid in pids.items() if process_running(pid)],
               max(1.0, 90 - (time.monotonic() - killed)), "no process of the job 90 s after the step was deleted")


def test_an_argo_step_killed_without_cleanup_is_garbage_collected(steps):
    step = steps.launch("argokill", epochs=400, step_floor_s=0.05)
    steps.wait(lambda: steps.trainers("argokill"), what="a running trainer")
    steps.core.delete_namespaced_pod(step, steps.ns, grace_period_seconds=0)
    steps.wait_gone("argokill", 60, "the garbage collector to remove the job")


def test_the_apiserver_away_for_20_s_mid_run_holds_the_plan_and_the_job_finishes(steps):
    step = steps.launch("apiaway", epochs=10, step_floor_s=0.05)  # floored until the API is back and seen
    steps.wait(lambda: steps.trainers("apiaway"), what="a running trainer")
    steps.wait(lambda: "generation 1" in steps.log(step), what="training")
    steps.plane.stop_apiserver()  # an upgrade, an etcd leader change: the API is away, the pods run on
    try:
        time.sleep(20)
    finally:
        steps.plane.start_apiserver()
    steps.wait(lambda: "cluster API back" in steps.log(step), 60, "the launcher to see the API back")
    steps.full_speed("apiaway")
    assert steps.wait_done(step, 300) == 0, steps.log_tail()
    s = steps.summary(step)
    assert s["status"] == "succeeded" and s["epochs_completed"] == 10 and s["master_restarts"] == 0
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


def test_a_retried_launcher_adopts_the_job_and_a_lost_master_is_taken_over_by_its_spare(steps):
    first = steps.launch("adopt", epochs=25, step_floor_s=0.05)  # floored until the new master is seen
    steps.wait(lambda: steps.trainers("adopt"), what="a running trainer")
    master_uid = steps.pod("edl-adopt-master").metadata.uid
    os.kill(steps.container_pid(first), signal.SIGKILL)  # the step's container died; its retry is a new pod
    steps.wait(lambda: steps.failed(first), 30, "the first step to fail")
    second = steps.launch("adopt", epochs=25, step_floor_s=0.05)
    steps.wait(lambda: "adopted the existing job" in steps.log(second), what="adoption")
    assert steps.pod("edl-adopt-master").metadata.uid == master_uid  # not a second job
    spare = steps.wait(lambda: steps.master("adopt", "standby"), 90, "the spare master ready")
    steps.core.delete_namespaced_pod("edl-adopt-master", steps.ns)  # lost, as when its node is drained
    steps.wait(lambda: (p := steps.master("adopt")) is not None and p.metadata.uid == spare.metadata.uid,
               30, "the spare serving")
    steps.wait(lambda: "MasterTakenOver" in steps.events(second), 30, "the take-over's event")
    steps.wait(lambda: (p := steps.master("adopt", "standby")) is not None and p.metadata.name == "edl-adopt-master",
               90, "a new spare under the first master's name")
    steps.full_speed("adopt")
    assert steps.wait_done(second, 300) == 0, steps.log_tail()
    s = steps.summary(second)
    assert s["status"] == "succeeded" and s["master_restarts"] >= 1
    assert steps.objects_of("adopt") == []


def test_a_launcher_killed_without_its_cleanup_leaves_no_pod_running_and_no_process(steps):
    """The step's container SIGKILLed and not retried: its pod stays, so the garbage collector
    does nothing. The dead-man switch does: the master, not beaten for 30 s, tells the trainers to leave,
    then exits 0, and nothing restarts it (restartPolicy OnFailure). The sidecar died with the launcher."""
    step = steps.launch("deadman", epochs=400, step_floor_s=0.05)
    steps.wait(lambda: steps.trainers("deadman"), what="a running trainer")
    steps.wait(lambda: "generation 1" in steps.log(step), what="training")
    pids = steps.job_pids("deadman")
    assert "edl-deadman-master/master" in pids, pids
    os.kill(steps.container_pid(step), signal.SIGKILL)
    killed = time.monotonic()
    steps.wait(lambda: steps.failed(step), 30, "the step to fail")

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
    # Floored until the master is checked: trainers keep training while their launcher is gone, and a short
    # job at full speed could end (and be cleaned up) before the second step adopted.
    first = steps.launch("reown", epochs=25, step_floor_s=0.05)
    steps.wait(lambda: steps.trainers("reown"), what="a running trainer")
    os.kill(steps.container_pid(first), signal.SIGKILL)
    steps.wait(lambda: steps.failed(first), 30, "the first step to fail")
    second = steps.launch("reown", epochs=25, step_floor_s=0.05)
    steps.wait(lambda: "adopted the existing job" in steps.log(second), what="adoption")
    master_uid = steps.pod("edl-reown-master").metadata.uid
    steps.core.delete_namespaced_pod(first, steps.ns)  # the workflow's pod GC removes the failed pod
    steps.wait(lambda: steps.pod(first) is None, 30, "the first pod to go")
    time.sleep(10)  # the garbage collector acts within a second or two of its owner going
    master = steps.pod("edl-reown-master")
    assert master is not None and master.metadata.uid == master_uid and not master.metadata.deletion_timestamp
    assert "secrets/edl-reown-token" in steps.objects_of("reown")
    steps.full_speed("reown")
    assert steps.wait_done(second, 150) == 0, steps.log_tail()
    assert steps.summary(second)["master_restarts"] == 0


def test_an_evicted_trainer_is_replaced(steps):
    step = steps.launch("evict", epochs=400, step_floor_s=0.05, max_t=1)
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


def test_trainer_pods_deleted_gracefully_leave_as_drained_trainers_and_their_peers_never_wait(steps):
    """Two of three trainer pods deleted as the scheduler preempts them (a graceful delete: SIGTERM, then
    SIGKILL after the grace period): their trainers ask the master to drain them and leave at the next
    switch, so the job's next generation is a prepared scale-down, not a failure its peers wait out, and
    the launcher replaces them; exactly once."""
    # The job trains slowly until the scale-down is seen (a cold run's job once ended before the deletes
    # were), then at its own speed.
    step = steps.launch("term", "--audit", epochs=8, trainers=3, max_t=3, step_floor_s=0.1)
    steps.wait(lambda: len(steps.trainers("term")) == 3, 180, "three running trainers")
    steps.wait(lambda: "→ 3 trainers" in steps.log(step), 120, "training at three")
    for pod in steps.trainers("term")[:2]:
        steps.core.delete_namespaced_pod(pod.metadata.name, steps.ns)  # the pod's own grace period: 30 s
    steps.wait(lambda: "(scale_down)" in steps.log(step), 120, "the deleted trainers drained")
    steps.full_speed("term")
    assert steps.wait_done(step, 300) == 0, steps.log_tail()
    s = steps.summary(step)
    assert s["status"] == "succeeded" and s["lost_samples"] == 0 and s["duplicate_samples"] == 0
    reasons = [g["reason"] for g in s["generations"]]
    assert "scale_down" in reasons and "failure" not in reasons, s["generations"]
    assert s["trainer_failures"] == 0, s
    steps.wait_gone("term", 90, "cleanup")


def test_a_data_set_several_times_the_scratch_size_trains_without_eviction(steps, plane_s3):
    """Review item 9: shards were copied into /tmp (an emptyDir with a sizeLimit) and the kubelet
    evicted the pod, again and again. The data is read from S3 by ranges instead."""
    data = f"s3://data/{steps.ns}-wide"
    # A small model (digits' 64-128-64-10): the scratch holds the exported model at the finish, which
    # edl stages there (Paddle's files, params.npz and model.onnx, about three copies of the model).
    r = run_edl("data", "prepare", "synthetic", "--rows", "160000", "--features", "64", "--shards", "8",
                "--out", data, env=plane_s3.env, timeout=180)
    assert r.returncode == 0, r.stderr
    size = sum(o.size for o in plane_s3.client().list_objects("data", f"{steps.ns}-wide/", recursive=True))
    scratch = 10 * 2**20
    assert size > 3 * scratch, size  # about 41 MB
    step = steps.launch("wide", "--data", data, "--model-def", "edl.zoo.digits", "--batch-size", "512",
                        "--scratch-size", "10Mi", epochs=1, max_t=1)
    code = steps.wait_done(step, 300)
    log = steps.log(step)
    assert code == 0, steps.log_tail()
    s = steps.summary(step)
    assert s["status"] == "succeeded" and s["epochs_completed"] == 1 and s["master_restarts"] == 0, s
    assert "evicted" not in log.lower() and "EmptyDir" not in log, log  # neither the master nor a trainer
    steps.wait_gone("wide", 60, "cleanup")


def test_an_oom_killed_trainer_fails_the_job_naming_the_limit(steps):
    step = steps.launch("oom", epochs=400, max_t=1, trainer_memory="100Mi")
    assert steps.wait_done(step, 180) != 0
    log = steps.log(step)
    assert "OOMKilled" in log and "memory limit 100Mi" in log and "--trainer-memory" in log, log
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


def node_cpu(steps, node: str = "node-0") -> float:
    """What a node of the plane gives pods (2 cores: at most this machine's)."""
    return float(parse_quantity(steps.core.read_node(node).status.allocatable["cpu"]))


def web_deployment(image: str, replicas: int, cpu: float, node: str | None = None) -> dict:
    """A higher-priority service (class edl-high): ``replicas`` pods of ``cpu`` cores, on ``node`` if given."""
    spec: dict = {"priorityClassName": "edl-high", "terminationGracePeriodSeconds": 2,
                  "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                  "containers": [{"name": "web", "image": image, "command": ["sleep", "3600"],
                                  "securityContext": {"allowPrivilegeEscalation": False,
                                                      "capabilities": {"drop": ["ALL"]}, "runAsUser": 10001},
                                  "resources": {"requests": {"cpu": str(cpu), "memory": "64Mi"}}}]}
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": spec}}}


def unschedulable_trainers(steps, job: str, seen: set[str]) -> set[str]:
    """Adds to ``seen`` the job's trainer pods the scheduler has found no room for."""
    for p in steps.trainers(job, phase="Pending"):
        if any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or []):
            seen.add(p.metadata.name)
    return seen


def test_a_higher_priority_service_takes_the_capacity_back(steps, kube):
    """The job grows into both nodes at low priority; a high-priority Deployment that needs most of
    the cluster gets it (the sidecar hands trainers back, the scheduler preempts what is left), and
    the job carries on with fewer trainers. A preempted trainer is not replaced by one that has no
    room: its replacement waits for the sidecar's next decision, which lowers the count."""
    # Sized by the node: trainers of 3/8 of one (three fit in two nodes beside the master and the step), a
    # service of two replicas of half a node each.
    cpu = node_cpu(steps)
    step = steps.launch("yield", "--priority-class", "edl-low", "--trainer-cpu", str(cpu * 3 / 8), epochs=400,
                        max_t=4, step_floor_s=0.05)
    steps.wait(lambda: len(steps.trainers("yield")) >= 3, 180, "growth to 3+ trainers")
    apps = client.AppsV1Api(kube)
    web = web_deployment(steps.plane.image("runtime"), replicas=2, cpu=cpu / 2)
    apps.create_namespaced_deployment(steps.ns, web)
    stuck: set[str] = set()
    steps.wait(lambda: unschedulable_trainers(steps, "yield", stuck) is not None and
               (d := apps.read_namespaced_deployment("web", steps.ns)).status.ready_replicas == 2 and d,
               120, "the service's two replicas Ready")
    steps.wait(lambda: unschedulable_trainers(steps, "yield", stuck) is not None and
               1 <= len(steps.trainers("yield")) <= 2, 60, "the job down to what is left")
    settle = time.monotonic() + 15  # a sidecar period and a half: whatever the launcher would start, it has
    while time.monotonic() < settle:
        unschedulable_trainers(steps, "yield", stuck)
        time.sleep(0.3)
    assert not stuck, f"trainers started with no room for them: {sorted(stuck)}\n{steps.log(step)[-3000:]}"
    assert "TrainersUnschedulable" not in steps.events() and "LauncherBelowTrainers" not in steps.events()
    assert steps.running(step)
    # The service leaves: the job grows back into the room (it once stayed small: its replacements had sat
    # Pending, and the sidecar held off growing after the launcher reported them unschedulable).
    apps.delete_namespaced_deployment("web", steps.ns)
    steps.wait(lambda: len(steps.trainers("yield")) >= 3, 90, "the job grown back to 3+ trainers")
    steps.core.delete_namespaced_pod(step, steps.ns)
    steps.wait_gone("yield", 90, "cleanup")


def test_a_step_under_the_runs_own_account_with_only_the_rendered_binding_runs_and_audits_the_job(steps, kube):
    """Review #6: KFP runs a run's pods under its account (pipeline-runner in a standalone install), so
    `edl k8s render --bind-account pipeline-runner` binds edl's launcher Role to it; nothing else. The
    same step without the binding is refused by RBAC, in one line. The step audits: the trainers' pods
    write the audit log under the job's checkpoint prefix on MinIO; the launcher reads it at the end
    (with the S3 Secret's keys) and reports lost and duplicated samples."""
    from edl.cluster import manifests
    from tests.plane.fixtures import apply

    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    core.create_namespaced_service_account(steps.ns, {"metadata": {"name": "pipeline-runner"}})  # KFP's, not ours
    refused = steps.launch("unbound", service_account="pipeline-runner")
    assert steps.wait_done(refused, 120) != 0
    errors = [line for line in steps.log(refused).splitlines() if line.startswith("edl: error:")]
    assert len(errors) == 1 and "refused" in errors[0] and "RBAC" in errors[0], steps.log(refused)[-2000:]
    plain = manifests.rbac(steps.ns)
    bindings = [o for o in manifests.rbac(steps.ns, ("pipeline-runner",)) if o not in plain]
    assert {o["kind"] for o in bindings} == {"RoleBinding", "ClusterRoleBinding"}
    apply(kube, bindings, steps.ns)
    try:
        step = steps.launch("runner", "--audit", epochs=3, service_account="pipeline-runner", style="kfp")
        assert steps.wait_done(step) == 0, steps.log_tail()
        s = steps.summary(step)
        assert s["status"] == "succeeded" and s["lost_samples"] == 0 and s["duplicate_samples"] == 0
        assert s["audited_samples_per_epoch"] == [1438] * 3  # digits' training split, once per epoch
        assert "lost 0, duplicated 0" in steps.log(step)
        steps.wait_gone("runner")
    finally:
        for o in bindings:
            if o["kind"] == "ClusterRoleBinding":
                rbac.delete_cluster_role_binding(o["metadata"]["name"])


# ------------------------------------------------------------ a lost node
HOLD = {"key": "test/hold", "value": "1", "effect": "NoSchedule"}


def hold_nodes(core, nodes: tuple[str, ...], on: bool) -> None:
    """New pods go elsewhere (a NoSchedule taint: the sidecar still counts the nodes' capacity)."""
    for n in nodes:
        core.patch_node(n, {"spec": {"taints": [HOLD] if on else None}})


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def pid_of(steps, pod, container: str) -> int:
    pid = steps.plane.container_pid(pod, container)
    assert pid is not None, f"{pod.metadata.name}/{container} has no process"
    return pid


@pytest.fixture
def lost_node(steps):
    """A third node, ``node-lost``, to be lost; the others held (no new pods) while a test moves a pod there."""
    steps.plane.add_node("node-lost", cpu="2", memory="4Gi")
    others = ("node-0", "node-1")
    try:
        steps.plane.prepull(on=("node-lost",))  # the master's and a trainer's images: the machine's copy, not 2.9 GB more
        yield others
    finally:
        hold_nodes(steps.core, others, False)
        steps.plane.restore_node("node-lost")
        steps.plane.remove_node("node-lost")


@pytest.mark.timeout(480)
def test_a_lost_node_loses_a_trainer_and_the_master_both_replaced_elsewhere_and_the_job_succeeds(steps, lost_node):
    """Review #12: a node's link is cut; its pods stay Running in the API, their processes run on,
    reaching nothing. Past --node-lost-timeout the launcher counts them lost: the trainer is
    replaced under a new id (not a failure), the master deleted by force and its spare on a live node
    takes over;
    the old master's late answers do not disturb the new generations (they once did, without end);
    the job succeeds."""
    job = "lostnode"
    # node-lost starts empty: the plan packs trainers best fit, and the small node-lost is the tightest
    # fit, so it is held until the first trainers run on the others.
    hold_nodes(steps.core, ("node-lost",), True)
    # The job must train on through the node's loss, the lost trainer's replacement and the new master
    # (about a minute from the loss; a fast machine trained 120 epochs of digits in 25 s, before any of
    # it): each step takes 50 ms or more (2 s an epoch at two trainers) until the new master is seen.
    epochs = 80
    step = steps.launch(job, "--node-lost-timeout", "10", epochs=epochs, max_t=2, trainers=2, step_floor_s=0.05)
    steps.wait(lambda: len(steps.trainers(job)) == 2, 120, "two running trainers")
    steps.wait(lambda: "· 2 trainers · step" in steps.log(step), 120, "training with two")
    first = {t.metadata.name for t in steps.trainers(job)}
    assert all(t.spec.node_name != "node-lost" for t in steps.trainers(job))
    hold_nodes(steps.core, ("node-lost",), False)
    # Move one trainer and the spare master to node-lost: the others take no new pods while their successors
    # land. The serving master deleted, its spare (elsewhere) takes over and the next spare goes to node-lost.
    spare = steps.wait(lambda: steps.master(job, "standby"), 120, "the spare master ready")
    hold_nodes(steps.core, lost_node, True)
    steps.core.delete_namespaced_pod(sorted(first)[-1], steps.ns)
    steps.core.delete_namespaced_pod(steps.master(job).metadata.name, steps.ns)
    moved = steps.wait(lambda: [t for t in steps.trainers(job) if t.spec.node_name == "node-lost"], 120,
                       "a trainer on node-lost")[0]
    steps.wait(lambda: (p := steps.master(job)) is not None and p.metadata.uid == spare.metadata.uid, 60,
               "the spare serving")
    spare = steps.wait(lambda: (p := steps.master(job, "standby")) is not None and p.spec.node_name == "node-lost"
                       and p, 120, "the next spare on node-lost")
    hold_nodes(steps.core, lost_node, False)
    # Its spare takes over again: the serving master is now on node-lost, and its next spare elsewhere.
    steps.core.delete_namespaced_pod(steps.master(job).metadata.name, steps.ns)
    moved_master = steps.wait(lambda: (p := steps.master(job)) is not None and p.metadata.uid == spare.metadata.uid
                              and p, 60, "the master on node-lost")
    steps.wait(lambda: (p := steps.master(job, "standby")) is not None and p.spec.node_name in lost_node, 120,
               "a spare elsewhere")
    victim = moved.metadata.name
    pids = [pid_of(steps, moved, "trainer"), pid_of(steps, moved_master, "master")]
    steps.wait(lambda: "· 2 trainers · step" in steps.log(step).rsplit("master lost", 1)[-1], 120,
               "training with the moved trainer and master")
    steps.plane.lose_node("node-lost")  # its link is cut: the pods stay Running, their processes run on
    steps.wait(lambda: steps.pod(victim) is None, 90, "the lost trainer's pod removed")
    replacement = steps.wait(lambda: [t for t in steps.trainers(job) if t.metadata.name not in first | {victim}],
                             90, "a replacement trainer")[0]
    assert replacement.spec.node_name in lost_node
    steps.wait(lambda: (p := steps.master(job)) is not None and p.metadata.uid != moved_master.metadata.uid
               and p.spec.node_name in lost_node, 90, "the spare serving elsewhere")
    steps.full_speed(job)
    assert steps.wait_done(step, 300) == 0, steps.log_tail()
    s = steps.summary(step)
    assert s["status"] == "succeeded" and s["epochs_completed"] == epochs, s
    assert s["trainer_failures"] == 0 and s["trainer_relaunches"] >= 1 and s["master_restarts"] >= 3, (
        f"{json.dumps(s)}\n{steps.log(step)[-8000:]}")
    log = steps.log(step)
    assert f"trainer {victim} node_lost (its node node-lost is not Ready" in log, log
    assert "MasterNodeLost" in steps.events(step)
    assert len(first | {victim, replacement.metadata.name}) == 4  # four trainers, four names: none reused
    steps.wait_gone(job, 60, "cleanup")
    steps.plane.restore_node("node-lost")  # it answers again: its kubelet ends what the API no longer has
    steps.wait(lambda: not any(alive(pid) for pid in pids), 30, "the lost pods' processes to end")


# ------------------------------------------------------------ two jobs in one namespace
def owners(obj) -> list[str]:
    return [r.uid for r in obj.metadata.owner_references or []]


def planned_jobs(steps) -> list[str]:
    """The jobs the namespace's autoscaler Lease has a line for (none while there is no such Lease)."""
    try:
        lease = steps.coord.read_namespaced_lease("edl-autoscaler", steps.ns)
    except client.ApiException:
        return []
    return list(json.loads((lease.metadata.annotations or {}).get("edl.dev/plan") or '{"lines": {}}')["lines"])


def test_two_jobs_at_once_in_one_namespace_keep_to_their_own_objects_and_checkpoints(steps, plane_s3):
    jobs = ("twina", "twinb")
    # Trainers of a quarter of a node: both jobs train at once beside their masters and steps on two nodes.
    cpu = str(node_cpu(steps) / 4)
    launched = {job: steps.launch(job, "--trainer-cpu", cpu, epochs=30) for job in jobs}
    steps.wait(lambda: all(steps.trainers(j) for j in jobs) and all(
        steps.coord.list_namespaced_lease(steps.ns, label_selector=f"edl.dev/job={j}").items for j in jobs),
        180, "both jobs training and publishing their demand")
    for job, step in launched.items():
        step_uid = steps.pod(step).metadata.uid
        selector = f"edl.dev/job={job}"
        pods = steps.core.list_namespaced_pod(steps.ns, label_selector=selector).items
        services = steps.core.list_namespaced_service(steps.ns, label_selector=selector).items
        secrets = steps.core.list_namespaced_secret(steps.ns, label_selector=selector).items
        leases = steps.coord.list_namespaced_lease(steps.ns, label_selector=selector).items
        assert pods and services and secrets and leases
        for obj in pods + services + secrets + leases:
            assert obj.metadata.name.startswith(f"edl-{job}-"), obj.metadata.name
        # Its own step's, not the other's: the demand Lease its launcher's sidecar writes too.
        for obj in pods + services + secrets + leases:
            assert owners(obj) == [step_uid], (obj.metadata.name, owners(obj))
    # One sidecar decides for both: the autoscaler Lease, owned by one of the two steps' pods, plans both jobs.
    steps.wait(lambda: set(planned_jobs(steps)) == {f"{steps.ns}/{j}" for j in jobs}, 60, "one plan for both jobs")
    lease = steps.coord.read_namespaced_lease("edl-autoscaler", steps.ns)
    step_pods = {steps.pod(step).metadata.uid for step in launched.values()}
    assert len(owners(lease)) == 1 and owners(lease)[0] in step_pods, owners(lease)
    # Nothing of edl's in the namespace that is not one of the two jobs' (by label and by name).
    labelled = steps.core.list_namespaced_pod(steps.ns, label_selector="edl.dev/job").items
    assert {p.metadata.labels["edl.dev/job"] for p in labelled} == set(jobs)
    for job, step in launched.items():
        assert steps.wait_done(step, 300) == 0, steps.log_tail()
    s3 = plane_s3.client()
    for job, step in launched.items():
        s = steps.summary(step)
        prefix = f"{steps.ns}/{job}/"
        assert s["status"] == "succeeded" and s["job"] == job and s["epochs_completed"] == 30, s
        assert s["final_model_uri"].startswith(f"s3://ckpt/{prefix}"), s["final_model_uri"]
        owner = json.loads(s3.get_object("ckpt", f"{prefix}edl-owner.json").read())
        assert owner["job"] == job
        keys = [o.object_name for o in s3.list_objects("ckpt", prefix=prefix, recursive=True)]
        assert any("/model/" in k or k.endswith("params.npz") for k in keys), keys
        other = next(j for j in jobs if j != job)
        assert not any(f"/{other}/" in k for k in keys)
    for job in jobs:
        steps.wait_gone(job, 60, f"job {job}'s objects to go")


# ------------------------------------------------------------ where trainers go
def test_trainers_run_only_on_the_nodes_their_selector_and_tolerations_allow(steps):
    """A pool of its own (a GPU pool, say): the label selects it, its taint keeps other pods off
    (the master among them), the trainers' toleration lets them on; the real scheduler decides."""
    pool, taint = "node-1", {"key": "test/dedicated", "value": "training", "effect": "NoSchedule"}
    steps.core.patch_node(pool, {"metadata": {"labels": {"test/pool": "training"}}, "spec": {"taints": [taint]}})
    try:
        step = steps.launch("pooled", "--trainer-node-selector", "test/pool=training",
                            "--trainer-tolerations", "test/dedicated=training:NoSchedule", epochs=6, max_t=2,
                            trainers=2)
        steps.wait(lambda: len(steps.trainers("pooled")) == 2, 120, "two running trainers")
        assert {t.spec.node_name for t in steps.trainers("pooled")} == {pool}
        assert steps.pod("edl-pooled-master").spec.node_name != pool  # it tolerates nothing
        assert steps.wait_done(step) == 0, steps.log_tail()
        assert steps.summary(step)["status"] == "succeeded"
        steps.wait_gone("pooled", 60, "cleanup")
    finally:
        steps.core.patch_node(pool, {"metadata": {"labels": {"test/pool": None}}, "spec": {"taints": None}})


def _free_cpu(steps, node: str) -> float:
    """The node's allocatable CPU less the requests of every pod bound to it and not finished."""
    pods = steps.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    used = sum(float(parse_quantity(((c.resources and c.resources.requests) or {}).get("cpu", "0")))
               for p in pods if p.status.phase not in ("Succeeded", "Failed") for c in p.spec.containers)
    return node_cpu(steps, node) - used


@pytest.mark.timeout(480)
def test_trainers_land_where_the_plan_puts_them_beside_a_higher_priority_service(steps, kube):
    """Seed case 2, scaled down: a higher-priority Deployment holds half of node-0. The sidecar's plan
    packs new trainers best fit around it (node-0's rest first, where the default scheduler's spread
    would go to the emptier node); each new trainer pod prefers its planned node (preferred node
    affinity, never required), the real scheduler binds it there, and the nodes fill up."""
    apps = client.AppsV1Api(kube)
    cpu = node_cpu(steps)
    trainer_cpu = cpu / 4  # a quarter of a node: at least three fit around the service, the master and the step
    web = web_deployment(steps.plane.image("runtime"), replicas=1, cpu=cpu / 2, node="node-0")
    apps.create_namespaced_deployment(steps.ns, web)
    steps.wait(lambda: (apps.read_namespaced_deployment("web", steps.ns).status.ready_replicas or 0) == 1, 120,
               "the service Ready")
    step = steps.launch("placed", "--priority-class", "edl-low", "--trainer-cpu", str(trainer_cpu), epochs=400,
                        max_t=8, trainer_memory="1Gi", step_floor_s=0.05)

    def settled() -> bool:
        pods = steps.trainers("placed", phase=None)
        return (len(pods) >= 3 and all(p.status.phase == "Running" for p in pods)
                and all(_free_cpu(steps, n) < trainer_cpu for n in ("node-0", "node-1")))

    steps.wait(settled, 240, "the job grown until no node holds another trainer")
    hinted = 0
    for p in steps.trainers("placed"):
        planned = preferred_node(kube.sanitize_for_serialization(p.spec))
        if planned is not None:
            hinted += 1
            assert p.spec.node_name == planned, (p.metadata.name, p.spec.node_name, planned)
    assert hinted >= 2  # the growth went through the plan
    assert steps.running(step)
    steps.core.delete_namespaced_pod(step, steps.ns)
    steps.wait_gone("placed", 90, "cleanup")
