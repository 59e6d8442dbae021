"""``edl launch``: the elastic-train step's entrypoint on Kubernetes.

Runs in the step's pod (KFP or Argo). Creates or adopts the job's objects,
follows the job to its end, streams progress and trainer failures to its log,
writes Kubernetes Events on its own pod, and removes every object of the job
when it ends or is cancelled (SIGTERM: a last checkpoint if it fits in 20 s, or in what
the pod's grace period leaves).
Exit code: 0 when the job succeeded, non-zero with the reason otherwise.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from edl.api.cluster import JobDemand, Snapshot, trainer_priorities, with_priorities
from edl.autoscale.policy import get_policy
from edl.autoscale.run import RunningSidecar, sidecar_config, start_sidecar
from edl.cluster import manifests as m
from edl.cluster.kube_cluster import KubeCluster
from edl.cluster.kube_api import KubeApi, load_api_client
from edl.cluster.kube_objects import decode_pod
from edl.cluster.kube_view import KubeClusterView
from edl.console import Console, plain_console, say
from edl.errors import EdlError, PermanentError, UserError
from edl.launcher.core import Cancelled, Launcher, ProgressView, audit_summary
from edl.api.spec import JobSpec, K8sOptions, Naming, Problem
from edl.jobargs import FLAG_NAMES
from edl.masterlink import FollowedMaster

log = logging.getLogger("edl.launcher")

EXIT_CANCELLED = 143
POLL_S = 2.0  # one round of API calls every 2 s: light on the apiserver, quick enough for rescales
FINAL_CHECKPOINT_S = 20.0
CLEANUP_S = 8.0  # the deletes and the last Events after the final checkpoint, inside the grace period


def final_checkpoint_budget(grace_s: float | None) -> float:
    """How long a cancelled job may spend on its last checkpoint: what the step pod's grace period
    (SIGTERM to SIGKILL; KFP leaves it at Kubernetes' 30 s) leaves after the cleanup."""
    if grace_s is None:
        return FINAL_CHECKPOINT_S
    return max(0.0, min(FINAL_CHECKPOINT_S, grace_s - CLEANUP_S))


def _s3_env_from(secret: dict | None) -> None:
    """The Secret's S3 settings as this process's environment where the step has none of its own."""
    import base64
    import os

    for key in m.S3_SECRET_KEYS:
        value = ((secret or {}).get("data") or {}).get(key)
        if value is not None:
            os.environ.setdefault(key, base64.b64decode(value).decode())


def master_placer(kube: KubeApi, spec: JobSpec, opts: K8sOptions,
                  clock: Callable[[], float] = time.time) -> Callable[[dict], str | None]:
    """Where the plan puts the master pod about to be created: the job's policy (``--sidecar-policy``)
    over one list of the nodes, every pod and the jobs' demand Leases, with the master waiting for a
    node (``Plan.pods``, the node its sidecar's plan would give a job's waiting pod). ``None`` when
    the policy places nothing or the cluster cannot be read (logged: the master then goes where the
    scheduler alone puts it)."""
    policy = get_policy(opts.sidecar_policy)
    cfg = sidecar_config(spec, opts)
    job = cfg.job
    # As its sidecar will publish it.
    mine = JobDemand(job, cfg.min, cfg.max, 0, cfg.trainer, node_selector=cfg.node_selector,
                     tolerations=cfg.tolerations)

    def place(manifest: dict) -> str | None:
        master = replace(decode_pod({**manifest, "status": {"phase": "Pending"}}), node=None)
        try:
            view = KubeClusterView(kube, spec.job, "launcher", lease_duration_s=15).list_once()
            now = clock()
            pods = [p for p in view.pods() if p.name != master.name]
            peers = with_priorities([d for d in view.peer_demands(now) if d.name != job], trainer_priorities(pods))
            plan = policy.plan(Snapshot(tuple(view.nodes()), (*pods, master), tuple(sorted((*peers, mine),
                                                                                            key=lambda d: d.name)), now))
        except EdlError as e:
            log.warning("master of %s placed by the scheduler alone: the plan needs the cluster listed (%s)", job,
                        str(e).splitlines()[0] if str(e) else type(e).__name__)
            return None
        return plan.pods.get(master.name)

    return place


def preemptible_below_trainers(me: dict, trainer_class: dict | None) -> str | None:
    """What to tell the user when this step's pod has a lower priority than the trainers' PriorityClass: the
    scheduler then takes it first to make room for higher-priority pods, and the job (its launcher and
    autoscale sidecar, the dead-man switch's beat) ends with it. ``None`` when it is not below them."""
    if trainer_class is None:
        return None
    mine, theirs = int((me.get("spec") or {}).get("priority") or 0), int(trainer_class.get("value") or 0)
    if mine >= theirs:
        return None
    name = (trainer_class.get("metadata") or {}).get("name", "")
    return (f"this step's pod has priority {mine}, below its trainers' {theirs} (PriorityClass {name}): the "
            f"scheduler preempts it first, and the job ends with it; run the step with PriorityClass {name}")


def _cancel(signum: int, _frame) -> None:
    raise Cancelled(signal.Signals(signum).name)


def launch(spec: JobSpec, opts: K8sOptions, *, kubeconfig: str | None = None, max_trainer_failures: int = 5,
           summary_out: Path | None = None, master_via: str = "service", console: Console | None = None,
           naming: Naming = FLAG_NAMES) -> int:
    """Run the job to its end. ``spec`` and ``opts`` come validated (``edl.api.spec.kubernetes_problems``);
    what only the cluster can tell is reported in the caller's ``naming``."""
    console = console or plain_console(soft_wrap=True)  # a pod log: one event per line, never wrapped
    kube = KubeApi(load_api_client(kubeconfig), opts.namespace)
    s3_secret = kube.get("secrets", opts.s3_secret) if opts.s3_secret else None
    if opts.s3_secret and s3_secret is None:
        # Before any object is created: a step that cannot reach its data should not start pods.
        raise naming.error(Problem("s3_secret", f"{opts.s3_secret!r}: no such Secret in namespace {opts.namespace!r}"))
    if spec.audit:
        _s3_env_from(s3_secret)  # this process reads the audit log the trainers write to the checkpoint store
    trainer_class = kube.get("priorityclasses", opts.priority_class) if opts.priority_class else None
    if opts.priority_class and trainer_class is None:
        raise naming.error(Problem("priority_class", f"{opts.priority_class!r}: no such PriorityClass in the cluster"))
    # The step's pod owns the job's objects: KFP's driver sets KFP_POD_NAME/KFP_POD_UID in every
    # task's pod; Argo steps (and the CronWorkflow) pass POD_NAME/POD_UID.
    owner = m.pod_from_env(("KFP_", ""))
    if owner is None:
        say(console, "KFP_POD_NAME/KFP_POD_UID or POD_NAME/POD_UID not set (not in a pod?): the job's objects "
                     "get no owner; they are removed when this launcher ends")
    grace_s, below = None, None
    if owner is not None and (me := kube.get("pods", owner["name"])) is not None:
        grace_s = (me.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        below = preemptible_below_trainers(me, trainer_class)
        if below is not None:
            say(console, below)
    budget_s = final_checkpoint_budget(grace_s)
    if budget_s < FINAL_CHECKPOINT_S:
        say(console, f"this pod's grace period is {grace_s} s: a cancelled job gets {budget_s:.0f} s for its "
                     f"last checkpoint (give the step {FINAL_CHECKPOINT_S + CLEANUP_S:.0f} s for the full "
                     f"{FINAL_CHECKPOINT_S:.0f} s)")
    cluster = KubeCluster(kube, spec, opts, owner, master_via, place_master=master_placer(kube, spec, opts))
    if below is not None:
        cluster.record("LauncherBelowTrainers", below, warning=True)
    launcher = Launcher(spec, cluster, max_trainer_failures=max_trainer_failures,
                        pending_timeout_s=opts.pending_timeout_s, trainer_prefix=cluster.trainer_prefix,
                        console=console, beat_in_background=True)
    previous = {sig: signal.signal(sig, _cancel) for sig in (signal.SIGTERM, signal.SIGINT)}
    sidecar: RunningSidecar | None = None
    try:
        endpoint = launcher.start()
        say(console, (f"job {spec.job}", "bold"), f" in namespace {opts.namespace}: master at {endpoint.address}, "
                     f"trainers {spec.min_trainers}..{spec.max_trainers}"
                     + (" (adopted the existing job)" if endpoint.adopted else ""))
        # The job's autoscale sidecar, in this process: it sets the master's desired count, which this
        # launcher follows. Its Leases belong to the step's pod, like the job's other objects.
        sidecar = start_sidecar(kube, spec.job, sidecar_config(spec, opts), FollowedMaster(lambda: launcher.endpoint),
                                opts.sidecar_policy, owner)
        with ProgressView(console) as view:
            final = launcher.run(view, poll_s=POLL_S)
            view.show(final)
        sidecar.stop()  # the job is over: the namespace goes on to another job's sidecar at once
        result = launcher.finish(summary_out, (lambda s: audit_summary(spec, s)) if spec.audit else None)
        audited = f", lost {result.lost_samples}, duplicated {result.duplicate_samples}" if spec.audit else ""
        cluster.record("JobSucceeded", f"{result.epochs_completed} epochs{audited}; model at {result.final_model_uri}")
        say(console, (f"job {spec.job} succeeded", "green"), f": {result.epochs_completed} epochs, "
                     f"{result.steps} steps{audited}; model at {result.final_model_uri}")
        return 0
    except Cancelled as why:
        started = time.monotonic()  # the pod's grace period runs from the signal
        say(console, f"cancelled ({why}): asking for a last checkpoint (up to {budget_s:.0f} s), "
                     "then removing the job's objects")
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)  # a second SIGTERM must not interrupt the cleanup
        if sidecar is not None:
            sidecar.stop()  # no rescale during the last checkpoint
        left_s = budget_s - (time.monotonic() - started)
        saved = launcher.final_checkpoint(left_s) if left_s > 0 else False
        cluster.record("JobCancelled", "cancelled; last checkpoint " + ("written" if saved else "not written"),
                       warning=True)
        return EXIT_CANCELLED
    except (UserError, PermanentError) as e:
        cluster.record("JobFailed", str(e), warning=True)
        raise
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)  # a SIGTERM now must not cut the cleanup short
        if sidecar is not None:
            sidecar.stop()  # before the cleanup, which removes the demand Lease it would write again
        launcher.shutdown(delete=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
