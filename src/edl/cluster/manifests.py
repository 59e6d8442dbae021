"""Every Kubernetes object of an elastic job, built as plain dicts from its ``JobSpec`` and ``K8sOptions``.

One builder per object, pure functions, shared by the launcher and ``edl k8s render``, so the
two can never disagree. The launcher (``cluster/kube_cluster.py``) creates the token Secret
(with the real token), the master Service, the master pod and one pod per trainer (from
``trainer_pod_spec``), all owned by the launcher's own pod; its autoscale sidecar (a thread of the
launcher, ``edl.autoscale.run``) writes the demand Lease. ``edl k8s render`` writes these for review and ``kubectl apply
--dry-run=server``: the RBAC (which the launcher never creates: it runs under it; apply it
once per namespace), the Secret with a placeholder token, the Service, the master pod, and the
trainers' pod as a ``PodTemplate``. Callers validate spec and options first (``edl.api.spec``).

Security choices, on purpose:
- the job token lives only in a Secret; pods read it through ``secretKeyRef``;
- S3/MinIO credentials come from a user-named Secret, never from flags;
- every container runs as a non-root user, without privilege escalation or
  capabilities, with a read-only root filesystem (``/tmp`` is an emptyDir) and
  with requests and limits;
- the master and the trainers get a ServiceAccount without an API token: they never call the API
  (only the launcher does, with its sidecar).
"""

from __future__ import annotations

import os
from typing import Any

from edl.api.images import trainer_image_for
from edl.api.spec import JobSpec, K8sOptions, node_selector, tolerations
from edl.jobargs import spec_to_argv
from edl.storage.claim import POD_UID_ENV

MASTER_PORT = 8470
APP = "edl"
RUN_AS = 10001  # the images' non-root user
LAUNCHER_SA = "edl-launcher"
TRAINER_SA = "edl-trainer"  # the job's pods (master and trainers): no API token


# ----------------------------------------------------------------- names
def names(job: str) -> dict[str, str]:
    base = f"edl-{job}"
    # Two names for the job's master pods, used in turn: the serving master under one, its spare (a
    # standby master, ``standby_master_pod``) under the other; a promoted spare's successor takes the free one.
    return {"master": f"{base}-master", "master_b": f"{base}-master-b", "service": f"{base}-master",
            "secret": f"{base}-token",
            "trainer_prefix": f"{base}-trainer-", "template": f"{base}-trainer", "lease": f"{base}-demand",
            "peers_policy": f"{base}-peers", "master_policy": f"{base}-master"}


def labels(job: str, role: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/instance": job, "app.kubernetes.io/component": role,
            "edl.dev/job": job, "edl.dev/role": role}


# Which of the job's master pods the Service sends to: the serving one; its spare waits beside it
# (``standby``), and one replaced is ``retired`` before it goes.
MASTER_STATE_LABEL = "edl.dev/master"
SERVING, STANDBY, RETIRED = "serving", "standby", "retired"


def master_address(job: str, namespace: str) -> str:
    return f"{names(job)['service']}.{namespace}.svc:{MASTER_PORT}"


# ------------------------------------------------------------- pod parts
def _security() -> dict:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def _token_env(job: str) -> dict:
    return {"name": "EDL_TOKEN", "valueFrom": {"secretKeyRef": {"name": names(job)["secret"], "key": "token"}}}


_POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


# The keys of the S3 Secret, each put into the environment variable of its name (edl.storage reads them).
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")


def _s3_env(opts: K8sOptions) -> list[dict]:
    if opts.s3_secret is None:
        return []
    return [{"name": key, "valueFrom": {"secretKeyRef": {"name": opts.s3_secret, "key": key}}}
            for key in S3_SECRET_KEYS]


def _tmp_volume(opts: K8sOptions) -> tuple[dict, dict]:
    return {"name": "tmp", "emptyDir": {"sizeLimit": opts.scratch_size}}, {"name": "tmp", "mountPath": "/tmp"}


# No Istio proxy in the job's pods (Kubeflow profile namespaces inject it): a restartPolicy: Never
# trainer with a proxy never completes, and the proxy would intercept the trainers' Gloo traffic.
# The label is what Istio reads first today; older releases read only the annotation.
_NO_ISTIO = {"sidecar.istio.io/inject": "false"}


def _pod_meta(name: str, job: str, role: str, opts: K8sOptions, owner: dict | None) -> dict:
    meta = _meta(name, job, role, opts, owner)
    meta["labels"].update(_NO_ISTIO)
    meta["annotations"] = dict(_NO_ISTIO)
    return meta


def _meta(name: str, job: str, role: str, opts: K8sOptions, owner: dict | None) -> dict:
    meta: dict = {"name": name, "namespace": opts.namespace, "labels": {**labels(job, role), **opts.extra_labels}}
    if owner is not None:
        # Garbage-collected with the launcher pod, hence with the workflow step.
        meta["ownerReferences"] = owner_references(owner)
    return meta


def owner_references(owner: dict, controller: bool = True) -> list[dict]:
    """``owner`` ({"name", "uid"} of a pod) as the object's owner: the launcher's pod controls the job's
    objects; a plain reference (``controller=False``) only ties an object's life to the pod."""
    ref = {"apiVersion": "v1", "kind": "Pod", "name": owner["name"], "uid": owner["uid"]}
    if controller:
        # No blockOwnerDeletion: setting it needs `update` on pods/finalizers where the
        # OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift, hardened clusters),
        # which edl's RBAC does not grant; the garbage collector deletes the objects all the same.
        ref["controller"] = True
    return [ref]


def pod_from_env(prefixes: tuple[str, ...] = ("",)) -> dict | None:
    """The pod a process runs in, from ``{PREFIX}POD_NAME``/``{PREFIX}POD_UID`` (the first prefix
    that has both), as the downward API or a workflow engine sets them; ``None`` outside a pod."""
    for prefix in prefixes:
        name, uid = os.environ.get(f"{prefix}POD_NAME"), os.environ.get(f"{prefix}POD_UID")
        if name and uid:
            return {"name": name, "uid": uid}
    return None


# ---------------------------------------------------------------- objects
def token_secret(spec: JobSpec, opts: K8sOptions, token: str, owner: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(names(spec.job)["secret"], spec.job, "token", opts, owner),
            "stringData": {"token": token}}


def master_selector(job: str) -> dict[str, str]:
    """The Service's selector: the job's serving master pod only, never its spare."""
    return {"edl.dev/job": job, "edl.dev/role": "master", MASTER_STATE_LABEL: SERVING}


def master_service(spec: JobSpec, opts: K8sOptions, owner: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(names(spec.job)["service"], spec.job, "master", opts, owner),
            "spec": {"selector": master_selector(spec.job),
                     "ports": [{"name": "http", "port": MASTER_PORT, "targetPort": MASTER_PORT, "protocol": "TCP"}]}}


def master_pod(spec: JobSpec, opts: K8sOptions, owner: dict | None = None, node: str | None = None,
               name: str | None = None, standby: bool = False) -> dict:
    """The job's master pod; ``node``: where the plan puts it
    (``edl.api.policy.Plan.pods``), as a preferred node affinity like a trainer's. ``standby``: its spare
    (``edl master --standby http``), started up and waiting for the launcher to wake it when the
    serving master is lost; ``name``: the pod's (default the job's first master name)."""
    vol, mount = _tmp_volume(opts)
    master = {
        "name": "master", "image": opts.image, "imagePullPolicy": "IfNotPresent",
        "command": ["edl", "master"],
        # The pod's own address, not 0.0.0.0: the same on a cluster, and on a node whose pods share
        # one network (the test plane's kubelet) two masters do not fight over one port.
        "args": [*spec_to_argv(spec), "--host", "$(POD_IP)", "--port", str(MASTER_PORT),
                 *(["--standby", "http", "--serving-master", master_address(spec.job, opts.namespace)]
                   if standby else [])],
        # The pod's uid: a master restarted in place knows the run lock's holder was its own earlier run.
        "env": [_token_env(spec.job), *_s3_env(opts), _POD_IP_ENV,
                {"name": POD_UID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}],
        "ports": [{"name": "http", "containerPort": MASTER_PORT, "protocol": "TCP"}],
        # Every second: a restarted master is in the Service's endpoints a second after it listens, not five.
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": MASTER_PORT}, "periodSeconds": 1},
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": _security(), "volumeMounts": [mount],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    # OnFailure: a crashed master restarts in place (its exits stay in lastState); one that ends the job
    # because its launcher went silent (edl.master.deadman) exits 0: the pod completes.
    pod_spec: dict[str, Any] = {
        "serviceAccountName": TRAINER_SA, "automountServiceAccountToken": False, "restartPolicy": "OnFailure",
        "securityContext": {"runAsNonRoot": True, "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [master], "volumes": [vol]}
    if opts.priority_class:
        # The trainers' class: a master without one has priority 0, below its own trainers, and the scheduler
        # preempts it first (a master restart where a trainer's drain would do). Of equal priority, the
        # longest running pods are the last the scheduler picks as victims, and the master started first.
        pod_spec["priorityClassName"] = opts.priority_class
    _prefer_node(pod_spec, node)
    # The master and its spare on different nodes where the cluster has room: one lost node, not both.
    pod_spec.setdefault("affinity", {})["podAntiAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
            "matchLabels": {"edl.dev/job": spec.job, "edl.dev/role": "master"}}}}]}
    meta = _pod_meta(name or names(spec.job)["master"], spec.job, "master", opts, owner)
    meta["labels"][MASTER_STATE_LABEL] = STANDBY if standby else SERVING
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def trainer_pod_spec(spec: JobSpec, opts: K8sOptions) -> dict:
    vol, mount = _tmp_volume(opts)
    resources: dict = {"cpu": opts.trainer_cpu, "memory": opts.trainer_memory}
    if opts.trainer_gpu:
        resources["nvidia.com/gpu"] = str(opts.trainer_gpu)
    container = {
        "name": "trainer", "image": trainer_image_for(opts.trainer_gpu, opts.trainer_image, opts.trainer_gpu_image),
        "imagePullPolicy": "IfNotPresent",
        "command": ["edl", "trainer"],
        "args": ["--master", master_address(spec.job, opts.namespace),
                 "--backend", "nccl" if opts.trainer_gpu else "gloo"],
        "env": [_token_env(spec.job), *_s3_env(opts),
                {"name": "EDL_TRAINER_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "EDL_TRAINER_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                # Where a trainer whose user code raised says its traceback is ($(VAR): Kubernetes expands it).
                {"name": "EDL_TRAINER_LOG", "value": f"kubectl logs -n {opts.namespace} $(EDL_TRAINER_ID)"},
                # The framework's threads fit the pod's CPU limit (rounded up), not the node's cores.
                {"name": "OMP_NUM_THREADS",
                 "valueFrom": {"resourceFieldRef": {"containerName": "trainer", "resource": "limits.cpu",
                                                    "divisor": "1"}}}],
        # Requests equal limits: the scheduler's accounting is the truth the policy plans with.
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": _security(), "volumeMounts": [mount],
        "terminationMessagePolicy": "FallbackToLogsOnError",  # the launcher reports the last lines
    }
    pod_spec: dict = {"serviceAccountName": TRAINER_SA, "automountServiceAccountToken": False,
                      "restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
                      "securityContext": {"runAsNonRoot": True, "fsGroup": RUN_AS,
                                          "seccompProfile": {"type": "RuntimeDefault"}},
                      "containers": [container], "volumes": [vol]}
    if opts.priority_class:
        pod_spec["priorityClassName"] = opts.priority_class
    if opts.trainer_node_selector:
        pod_spec["nodeSelector"] = node_selector(opts.trainer_node_selector)
    if opts.trainer_tolerations:
        pod_spec["tolerations"] = tolerations(opts.trainer_tolerations)
    return pod_spec


def trainer_template(spec: JobSpec, opts: K8sOptions, owner: dict | None = None) -> dict:
    """The trainer pods' template, as a ``PodTemplate`` object (the launcher names each pod)."""
    meta = _meta(names(spec.job)["template"], spec.job, "trainer", opts, owner)
    pod = _pod_meta(names(spec.job)["template"], spec.job, "trainer", opts, None)
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": meta,
            "template": {"metadata": {"labels": pod["labels"], "annotations": pod["annotations"]},
                         "spec": trainer_pod_spec(spec, opts)}}


PREFERRED_NODE_WEIGHT = 100  # the most a preferred term can weigh: NodeAffinity then scores the node 100


def trainer_pod(spec: JobSpec, opts: K8sOptions, name: str, owner: dict | None = None,
                node: str | None = None) -> dict:
    """A trainer pod; ``node``: where the plan puts it, as a *preferred* node affinity.

    Preferred, never required: a node that filled up since the plan was made must not leave the
    trainer Pending. ``matchFields`` on ``metadata.name`` names the node itself (its hostname label
    need not match its name). In kube-scheduler's default profile NodeAffinity weighs 2 against 1
    each for NodeResourcesFit and BalancedAllocation, so a node that has room wins over the spread
    the scheduler would otherwise choose (``edl.sim.kube_scheduler`` models the same)."""
    pod_spec = trainer_pod_spec(spec, opts)
    _prefer_node(pod_spec, node)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _pod_meta(name, spec.job, "trainer", opts, owner),
            "spec": pod_spec}


def _prefer_node(pod_spec: dict, node: str | None) -> None:
    """The plan's node as a preferred node affinity (none when ``node`` is ``None``)."""
    if node is not None:
        pod_spec["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": PREFERRED_NODE_WEIGHT,
             "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}}]}}


def preferred_node(pod_spec: dict) -> str | None:
    """The node ``trainer_pod`` made the pod prefer, read back from its spec (``None``: none)."""
    terms = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    for term in terms:
        for f in (term.get("preference") or {}).get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "In" and len(f.get("values") or ()) == 1:
                return f["values"][0]
    return None


def network_policies(spec: JobSpec, opts: K8sOptions) -> list[dict]:
    """Ingress the job needs where a namespace denies the rest: TCP among the job's own pods (trainers'
    collective, trainers to the master), and the master's port from the namespace's pods (the launcher:
    the step's pod, labelled by KFP or Argo, not by edl; the master checks its token)."""
    job_pods = {"matchLabels": {"edl.dev/job": spec.job}}
    master = {"matchLabels": {"edl.dev/job": spec.job, "edl.dev/role": "master"}}

    def policy(name: str, selector: dict, ingress: dict) -> dict:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": _meta(name, spec.job, "network", opts, None),
                "spec": {"podSelector": selector, "policyTypes": ["Ingress"], "ingress": [ingress]}}

    return [policy(names(spec.job)["peers_policy"], job_pods,
                   {"from": [{"podSelector": job_pods}], "ports": [{"protocol": "TCP"}]}),
            policy(names(spec.job)["master_policy"], master,
                   {"from": [{"podSelector": {}}], "ports": [{"protocol": "TCP", "port": MASTER_PORT}]})]


# -------------------------------------------------------------------- RBAC
def _binding(kind: str, name: str, role: str, account: str, namespace: str) -> dict:
    """A RoleBinding (``kind``) in ``namespace`` or a ClusterRoleBinding of ``role`` to one ServiceAccount."""
    meta = {"name": name, "labels": {"app.kubernetes.io/name": APP}}
    if kind == "RoleBinding":
        meta["namespace"] = namespace
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role" if kind == "RoleBinding" else "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}


LAUNCHER_PRIORITY_ROLE = "edl-launcher-priorityclasses"


def launcher_bindings(namespace: str, account: str) -> list[dict]:
    """The launcher's Role and ClusterRole bound to ``account``: the account a workflow runs its step's
    pod under (KFP runs every pod of a run, its driver too, under the run's account: ``pipeline-runner``
    in a standalone install, ``default-editor`` in a Kubeflow profile namespace), so that the step can
    launch the job without asking KFP to run as ``edl-launcher``, which lacks what KFP's own pods need."""
    if account == LAUNCHER_SA:
        return [_binding("RoleBinding", LAUNCHER_SA, LAUNCHER_SA, LAUNCHER_SA, namespace),
                _binding("ClusterRoleBinding", f"{LAUNCHER_PRIORITY_ROLE}-{namespace}", LAUNCHER_PRIORITY_ROLE,
                         LAUNCHER_SA, namespace)]
    return [_binding("RoleBinding", f"{LAUNCHER_SA}-{account}", LAUNCHER_SA, account, namespace),
            _binding("ClusterRoleBinding", f"{LAUNCHER_PRIORITY_ROLE}-{namespace}-{account}", LAUNCHER_PRIORITY_ROLE,
                     account, namespace)]


def rbac(namespace: str, bind_accounts: tuple[str, ...] = ()) -> list[dict]:
    """ServiceAccounts, Roles and bindings: only the resources and verbs the code uses. The launcher's
    role is bound to ``edl-launcher`` (``edl launch`` as a pod of one's own) and to each of
    ``bind_accounts`` (the accounts workflows run their steps under; they are not created here)."""
    def sa(name: str, automount: bool) -> dict:
        return {"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": automount,
                "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": APP}}}

    launcher_rules = [
        # Master and trainer pods: created, watched, deleted (drained trainers, cleanup on SIGTERM).
        # patch: a retried step (a new pod) re-points the ownerReferences of the job it adopts to itself.
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete", "patch"]},
        {"apiGroups": [""], "resources": ["services", "secrets"], "verbs": ["get", "create", "delete", "patch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        # Its autoscale sidecar publishes the job's demand in a Lease (removed on cleanup); the sidecar that
        # decides for the namespace holds the autoscaler Lease, watches the demands, and deletes it to hand the
        # namespace on when it stops. Before it creates the master it lists the demands once.
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "verbs": ["get", "list", "watch", "create", "update", "delete"]},
    ]
    # The launcher checks that --priority-class exists before it creates anything, and reads the
    # nodes its pods run on: one NotReady/Unknown past --node-lost-timeout means its pods are lost.
    # Its sidecar, when it decides for the namespace, watches every node and pod (read-only); before
    # it creates the master the launcher lists them once, for the plan's node of the master
    # (``edl.launcher.kube.master_placer``).
    launcher_cluster_rules = [{"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"],
                               "verbs": ["get"]},
                              {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]}]
    role_meta = {"namespace": namespace, "labels": {"app.kubernetes.io/name": APP}}
    launcher_role, priority_role = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": LAUNCHER_SA, **role_meta}, "rules": launcher_rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": LAUNCHER_PRIORITY_ROLE, "labels": {"app.kubernetes.io/name": APP}},
         "rules": launcher_cluster_rules}]
    launcher_rb, launcher_crb = launcher_bindings(namespace, LAUNCHER_SA)
    return [
        sa(LAUNCHER_SA, True), sa(TRAINER_SA, False),
        launcher_role, launcher_rb, priority_role, launcher_crb,
        *(b for account in dict.fromkeys(bind_accounts) if account != LAUNCHER_SA
          for b in launcher_bindings(namespace, account)),
    ]


DEPLOYER_ROLE = "edl-deployer"


def deployer_rbac(namespace: str, accounts: tuple[str, ...]) -> list[dict]:
    """What the pipeline's optional ``deploy`` step needs besides the launcher's Role, as a Role of its own
    bound to ``accounts`` (the run's account): create or replace the KServe InferenceService and the
    Secret and ServiceAccount that carry its S3 credentials, and list the predictor's pods while it waits
    for them (``edl.pipeline.deploy``). Rendered only
    when asked for (``edl k8s render --bind-deployer``): a pipeline that never deploys holds no such right."""
    if not accounts:
        return []
    rules = [{"apiGroups": ["serving.kserve.io"], "resources": ["inferenceservices"],
              "verbs": ["get", "create", "update"]},
             {"apiGroups": [""], "resources": ["secrets", "serviceaccounts"], "verbs": ["get", "create", "update"]},
             # the predictor's pods, to wait until they serve the model or say why they cannot
             {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": DEPLOYER_ROLE, "namespace": namespace, "labels": {"app.kubernetes.io/name": APP}},
            "rules": rules}
    return [role, *(_binding("RoleBinding", f"{DEPLOYER_ROLE}-{account}", DEPLOYER_ROLE, account, namespace)
                    for account in dict.fromkeys(accounts))]


PLACEHOLDER_TOKEN = "REPLACED-BY-THE-LAUNCHER-AT-START"


def render(spec: JobSpec, opts: K8sOptions, bind_accounts: tuple[str, ...] = (),
           deploy_accounts: tuple[str, ...] = ()) -> dict[str, list[dict]]:
    """Every object, grouped by the file ``edl k8s render`` writes it to (applied in name order);
    ``bind_accounts``: see ``rbac``; ``deploy_accounts``: see ``deployer_rbac`` (its file only then)."""
    deployer = {"01-deploy-rbac.yaml": deployer_rbac(opts.namespace, deploy_accounts)} if deploy_accounts else {}
    return {
        "00-rbac.yaml": rbac(opts.namespace, bind_accounts),
        **deployer,
        "10-token-secret.yaml": [token_secret(spec, opts, PLACEHOLDER_TOKEN)],
        "20-master-service.yaml": [master_service(spec, opts)],
        "30-master-pod.yaml": [master_pod(spec, opts)],
        "40-trainer-template.yaml": [trainer_template(spec, opts)],
        "50-network-policies.yaml": network_policies(spec, opts),
    }
