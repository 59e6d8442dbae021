"""The Kubernetes objects of a job: schema-valid, least privilege, no secrets in the open."""

from __future__ import annotations

import dataclasses
import json

import kubernetes_validate
import pytest

from edl.api.spec import JobSpec, K8sOptions, kubernetes_problems, with_trainer_images
from edl.autoscale.policy import POLICY_NAMES
from edl.cluster import manifests as m
from edl.errors import UserError
from edl.jobargs import FLAG_NAMES

K8S_VERSION = "1.30.0"  # the oldest Kubernetes we support; the schemas ship with kubernetes-validate

SPEC = JobSpec(job="mnist", model_def="edl.zoo.digits", data="s3://data/digits", epochs=3, batch_size=64,
               min_trainers=1, max_trainers=4, trainers=2, checkpoint_uri="s3://ckpt/mnist")
OPTS = with_trainer_images(K8sOptions(namespace="ml", s3_secret="minio-creds", priority_class="batch-low"), "paddle")
GPU = dataclasses.replace(OPTS, trainer_gpu=1, trainer_image="edl-trainer-gpu:0.1.0")
OWNER = {"name": "launcher-abc", "uid": "6a1f7c3e-0000-4000-8000-000000000001"}


def all_objects(opts: K8sOptions = OPTS) -> list[dict]:
    objs = [o for group in m.render(SPEC, opts).values() for o in group]
    objs.append(m.trainer_pod(SPEC, opts, "edl-mnist-trainer-0", OWNER))
    objs.append(m.trainer_pod(SPEC, opts, "edl-mnist-trainer-1", OWNER, node="node-7"))
    return objs


def containers(obj: dict) -> list[dict]:
    spec = obj.get("spec") or obj.get("template", {}).get("spec") or {}
    return spec.get("containers", [])


@pytest.mark.parametrize("opts", [OPTS, GPU, with_trainer_images(K8sOptions(namespace="default", s3_secret="s"), "torch")], ids=["cpu", "gpu", "min"])
def test_every_object_is_valid_against_the_kubernetes_schemas(opts):
    for obj in all_objects(opts):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)  # raises on any unknown or mistyped field


def test_the_schema_check_catches_a_bad_field():
    pod = m.master_pod(SPEC, OPTS)
    pod["spec"]["containers"][0]["resource"] = {}  # typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_rbac_is_least_privilege():
    rbac = m.rbac("ml")
    roles = {(o["kind"], o["metadata"]["name"]): o for o in rbac if o["kind"] in ("Role", "ClusterRole")}
    for role in roles.values():
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
    launcher = {r: set(rule["verbs"]) for rule in roles[("Role", "edl-launcher")]["rules"] for r in rule["resources"]}
    # Never list or watch other Secrets; patch only re-points ownerReferences when a retried step adopts
    # its job (delete and create by name allow as much already).
    assert launcher["secrets"] == {"get", "create", "delete", "patch"}
    assert launcher["pods"] == {"get", "list", "watch", "create", "delete", "patch"}  # no update
    # Leases: its sidecar's demand, and the namespace's autoscaler Lease when its sidecar decides.
    assert launcher["leases"] == {"get", "list", "watch", "create", "update", "delete"}
    # Cluster-wide, read only: a priority class by name, and the nodes and pods (the deciding sidecar
    # watches them; the launcher lists them once to plan where the master goes).
    across = {r: set(rule["verbs"]) for rule in roles[("ClusterRole", m.LAUNCHER_PRIORITY_ROLE)]["rules"]
              for r in rule["resources"]}
    assert across == {"priorityclasses": {"get"}, "nodes": {"get", "list", "watch"}, "pods": {"get", "list", "watch"}}
    # The job's own pods call no API: no token, and no account of their own with rights.
    sas = {o["metadata"]["name"]: o for o in rbac if o["kind"] == "ServiceAccount"}
    assert set(sas) == {"edl-launcher", "edl-trainer"} and sas["edl-trainer"]["automountServiceAccountToken"] is False
    for pod in (m.master_pod(SPEC, OPTS)["spec"], m.trainer_pod_spec(SPEC, OPTS)):
        assert pod["serviceAccountName"] == "edl-trainer" and pod["automountServiceAccountToken"] is False


def test_pods_are_locked_down_and_sized():
    for obj in all_objects(GPU):
        for c in containers(obj):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"] and c["resources"]["limits"]
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]  # the one writable place
    for pod in (m.master_pod(SPEC, GPU), m.trainer_pod(SPEC, GPU, "t")):
        assert pod["spec"]["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]
    small = dataclasses.replace(OPTS, scratch_size="64Mi")  # --scratch-size
    for pod in (m.master_pod(SPEC, small), m.trainer_pod(SPEC, small, "t")):
        assert pod["spec"]["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    trainer = containers(m.trainer_pod(SPEC, GPU, "t"))[0]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "1" and "nccl" in trainer["args"]
    assert m.trainer_pod(SPEC, GPU, "t")["spec"]["priorityClassName"] == "batch-low"
    # The master too: without a class it has priority 0, and a higher-priority pod's preemption takes it first.
    assert m.master_pod(SPEC, GPU)["spec"]["priorityClassName"] == "batch-low"


def test_no_secret_in_args_or_specs_only_in_secrets():
    token = "tok-" + "x" * 40
    objs = all_objects() + [m.token_secret(SPEC, OPTS, token)]
    for obj in objs:
        if obj["kind"] == "Secret":
            continue
        text = json.dumps(obj)
        assert token not in text and m.PLACEHOLDER_TOKEN not in text
        for c in containers(obj):
            env = {e["name"]: e for e in c["env"]}
            assert env["EDL_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "edl-mnist-token", "key": "token"}
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                if key in env:
                    assert env[key]["valueFrom"]["secretKeyRef"]["name"] == "minio-creds"
            assert not any("token" in a.lower() or "secret" in a.lower() for a in c.get("args", []))


def test_names_are_deterministic_and_objects_owned_by_the_launcher():
    a, b = m.render(SPEC, OPTS), m.render(SPEC, OPTS)
    assert a == b
    pod = m.master_pod(SPEC, OPTS, OWNER)
    ref = pod["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["name"], ref["uid"]) == ("Pod", OWNER["name"], OWNER["uid"])
    assert pod["metadata"]["labels"]["edl.dev/job"] == "mnist"
    svc = m.master_service(SPEC, OPTS)
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    trainer = containers(m.trainer_pod(SPEC, OPTS, "t"))[0]
    assert "edl-mnist-master.ml.svc:8470" in trainer["args"]


@pytest.mark.parametrize("spec_over, opts_over, culprit", [
    ({"job": "MNIST_1"}, {}, "--job-name"),
    ({"job": "x" * 41}, {}, "--job-name"),
    ({"checkpoint_uri": "/tmp/ckpt"}, {}, "--checkpoint-uri"),
    ({"data": "/data/digits"}, {}, "--data"),
    ({}, {"s3_secret": None}, "--s3-secret"),
    ({}, {"namespace": "Bad NS"}, "--namespace"),
    ({}, {"trainer_cpu": "two"}, "--trainer-cpu"),
    ({}, {"trainer_memory": "0Gi"}, "--trainer-memory"),
    ({}, {"sidecar_policy": "greedy"}, "--sidecar-policy"),
    ({}, {"sidecar_jitter_s": 20.0}, "--sidecar-jitter"),
    ({}, {"scratch_size": "big"}, "--scratch-size"),
    ({}, {"scratch_size": "0Mi"}, "--scratch-size"),
    ({}, {"trainer_node_selector": "pool"}, "--trainer-node-selector 'pool': expected KEY=VALUE"),
    ({}, {"trainer_node_selector": "pool=a b"}, "--trainer-node-selector"),
    ({}, {"trainer_tolerations": "gpu:Sometimes"}, "--trainer-tolerations 'gpu:Sometimes': expected KEY"),
    ({}, {"trainer_tolerations": "gpu"}, "--trainer-tolerations"),
    ({}, {"trainer_image": ""}, "--trainer-image empty, and edl cannot tell the model definition's framework"),
    ({}, {"trainer_gpu": 1, "trainer_gpu_image": ""}, "--trainer-gpu-image empty"),
    ({}, {"trainer_image": "reg/edl trainer"}, "--trainer-image 'reg/edl trainer': must be an image reference"),
])
def test_bad_options_name_the_culprit(spec_over, opts_over, culprit):
    """What ``edl launch`` and ``edl k8s render`` check before building any object."""
    with pytest.raises(UserError, match=culprit):
        FLAG_NAMES.check(kubernetes_problems(dataclasses.replace(SPEC, **spec_over),
                                             dataclasses.replace(OPTS, **opts_over), POLICY_NAMES))


def test_no_istio_proxy_in_the_jobs_pods():
    """Review #19: a restartPolicy: Never trainer with an istio-proxy never completes."""
    template = m.trainer_template(SPEC, OPTS)["template"]
    for meta in (m.master_pod(SPEC, OPTS)["metadata"], m.trainer_pod(SPEC, OPTS, "t", OWNER)["metadata"],
                 template["metadata"]):
        assert meta["annotations"]["sidecar.istio.io/inject"] == "false"
        assert meta["labels"]["sidecar.istio.io/inject"] == "false"
        assert meta["labels"]["edl.dev/job"] == "mnist"


def test_the_network_policies_admit_the_jobs_own_traffic_and_the_launcher_to_the_master():
    """Review #19: TCP among one job's pods, and the master's port from the namespace (the launcher)."""
    policies = m.render(SPEC, OPTS)["50-network-policies.yaml"]
    by_name = {p["metadata"]["name"]: p["spec"] for p in policies}
    peers, master = by_name["edl-mnist-peers"], by_name["edl-mnist-master"]
    job = {"matchLabels": {"edl.dev/job": "mnist"}}
    assert peers["podSelector"] == job and peers["policyTypes"] == ["Ingress"]
    assert peers["ingress"] == [{"from": [{"podSelector": job}], "ports": [{"protocol": "TCP"}]}]
    assert master["podSelector"] == {"matchLabels": {"edl.dev/job": "mnist", "edl.dev/role": "master"}}
    assert master["ingress"] == [{"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": m.MASTER_PORT}]}]
    pods = [m.master_pod(SPEC, OPTS), m.trainer_pod(SPEC, OPTS, "t")]
    assert all(p["metadata"]["labels"].items() >= job["matchLabels"].items() for p in pods)  # selected
    assert all(p["metadata"]["namespace"] == "ml" for p in policies)


def test_trainers_go_where_the_node_selector_and_tolerations_say_and_the_master_stays_anywhere():
    opts = dataclasses.replace(OPTS, trainer_node_selector="pool=gpu, example.com/zone=a",
                               trainer_tolerations="nvidia.com/gpu:NoSchedule,dedicated=ml:NoExecute")
    trainer = m.trainer_pod(SPEC, opts, "edl-mnist-trainer-0")["spec"]
    assert trainer["nodeSelector"] == {"pool": "gpu", "example.com/zone": "a"}
    assert trainer["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"}]
    master = m.master_pod(SPEC, opts)["spec"]
    assert "nodeSelector" not in master and "tolerations" not in master
    assert "nodeSelector" not in m.trainer_pod(SPEC, OPTS, "edl-mnist-trainer-0")["spec"]  # default: any node
    for obj in all_objects(opts):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_owner_references_ask_for_no_block_owner_deletion_and_the_master_pod_completes_when_it_ends():
    """blockOwnerDeletion needs `update` on pods/finalizers under OwnerReferencesPermissionEnforcement,
    which edl's RBAC does not grant; the master exits 0 only when it ends the job (dead-man switch)."""
    owned = [o for objs in m.render(SPEC, OPTS).values() for o in objs]
    owned += [m.master_pod(SPEC, OPTS, OWNER), m.trainer_pod(SPEC, OPTS, "t", OWNER),
              m.token_secret(SPEC, OPTS, "x", OWNER), m.master_service(SPEC, OPTS, OWNER)]
    refs = [r for o in owned for r in o["metadata"].get("ownerReferences") or []]
    assert refs and all("blockOwnerDeletion" not in r for r in refs)
    assert {r.get("controller") for r in refs} == {True}
    assert "pods/finalizers" not in json.dumps(m.rbac("ml"))
    pod = m.master_pod(SPEC, OPTS, OWNER)
    assert pod["spec"]["restartPolicy"] == "OnFailure"
    master = next(c for c in containers(pod) if c["name"] == "master")
    assert master["args"][master["args"].index("--launcher-timeout") + 1] == "30.0"


def test_a_trainer_names_where_its_log_is_read_after_its_own_id():
    """A trainer whose user code raised points at its traceback with this (``$(VAR)`` is expanded by
    Kubernetes from variables defined before it)."""
    env = [e["name"] for e in containers(m.trainer_pod(SPEC, OPTS, "edl-mnist-trainer-0", OWNER))[0]["env"]]
    log = next(e for e in containers(m.trainer_pod(SPEC, OPTS, "t", OWNER))[0]["env"] if e["name"] == "EDL_TRAINER_LOG")
    assert log["value"] == "kubectl logs -n ml $(EDL_TRAINER_ID)"
    assert env.index("EDL_TRAINER_ID") < env.index("EDL_TRAINER_LOG")


def test_a_planned_node_is_a_preferred_affinity_never_a_required_one_and_reads_back():
    pod = m.trainer_pod(SPEC, dataclasses.replace(OPTS, trainer_node_selector="pool=a"), "t1", OWNER, node="node-7")
    affinity = pod["spec"]["affinity"]["nodeAffinity"]
    assert list(affinity) == ["preferredDuringSchedulingIgnoredDuringExecution"]  # nothing required
    term = affinity["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["weight"] == 100 and term["preference"]["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": ["node-7"]}]
    assert pod["spec"]["nodeSelector"] == {"pool": "a"}  # the user's selector still binds
    assert m.preferred_node(pod["spec"]) == "node-7"
    assert m.preferred_node(m.trainer_pod(SPEC, OPTS, "t2", OWNER)["spec"]) is None
    assert "affinity" not in m.trainer_pod(SPEC, OPTS, "t2", OWNER)["spec"]
