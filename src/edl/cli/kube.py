"""``edl launch`` and ``edl k8s render``: a job on Kubernetes, and its objects written out for review."""

from __future__ import annotations

import argparse
from pathlib import Path

from edl.api.spec import JobSpec, K8sOptions
from edl.autoscale.policy import POLICY_NAMES
from edl.cli.common import add_kubeconfig
from edl.errors import UserError
from edl.jobargs import FLAG_NAMES, add_job_arguments, add_k8s_arguments


def _kubernetes_job(a: argparse.Namespace) -> tuple[JobSpec, K8sOptions]:
    """The spec and pod options of ``edl launch``/``edl k8s render``, validated for Kubernetes."""
    from edl.api.spec import kubernetes_problems, with_trainer_images
    from edl.autoscale.policy import POLICY_NAMES
    from edl.jobargs import options_from_args, spec_from_args
    from edl.modeldef import framework_of_source

    spec = spec_from_args(a)
    opts = with_trainer_images(options_from_args(a), framework_of_source(spec.model_def))
    FLAG_NAMES.check(kubernetes_problems(spec, opts, POLICY_NAMES))
    return spec, opts


def cmd_launch(a: argparse.Namespace) -> int:
    from edl.api.spec import launcher_problems
    from edl.launcher.kube import launch

    spec, opts = _kubernetes_job(a)
    FLAG_NAMES.check(launcher_problems(a.max_trainer_failures))
    return launch(spec, opts, kubeconfig=a.kubeconfig,
                  max_trainer_failures=a.max_trainer_failures,
                  summary_out=Path(a.summary_out) if a.summary_out else None, master_via=a.master_via)


def cmd_k8s_render(a: argparse.Namespace) -> int:
    import yaml

    from edl.cluster.manifests import render

    import re

    for flag, accounts in (("--bind-account", a.bind_accounts), ("--bind-deployer", a.deploy_accounts)):
        for account in accounts:
            if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", account) or len(account) > 200:
                raise UserError(f"{flag} {account!r}: must be a ServiceAccount name (lowercase letters, "
                                "digits, '-' and '.')")
    files = render(*_kubernetes_job(a), tuple(a.bind_accounts), tuple(a.deploy_accounts))  # everything is validated before a file is written
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {a.out!r} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    for name, objects in files.items():
        path = out / name
        tmp = path.with_suffix(".yaml.tmp")
        tmp.write_text(yaml.safe_dump_all(objects, sort_keys=False))
        tmp.replace(path)
    count = sum(len(o) for o in files.values())
    print(f"wrote {count} objects in {len(files)} files to {out}; review them, then: "
          f"kubectl apply --dry-run=server -f {out}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``launch`` and ``k8s render`` commands."""
    la = sub.add_parser("launch", help="run a job on Kubernetes (the elastic-train step's entrypoint)",
                        description="Create or adopt the job's token Secret, master pod and Service, run the job's "
                                    "autoscale sidecar (a thread of this process), keep the trainer pods at the "
                                    "master's desired count, and remove "
                                    "everything when the job ends or on SIGTERM (after a last checkpoint, if it "
                                    "fits in 20 s). Exits 0 when the job succeeded.")
    add_job_arguments(la)
    add_k8s_arguments(la, POLICY_NAMES)
    la.add_argument("--max-trainer-failures", type=int, default=5,
                    help="fail the job when trainers crash more than this many times with no training step "
                         "between the crashes (preemptions and drains are not crashes): a step committed since the "
                         "last crash, or 10 minutes since it, forgives the earlier ones; the master's restarts "
                         "count likewise, against 10; 0: at the first crash (default 5)")
    la.add_argument("--summary-out", default=None, help="write the run summary (JSON) to this file")
    add_kubeconfig(la)
    la.add_argument("--master-via", choices=["service", "pod-ip"], default="service",
                    help="reach the master through its Service (default) or its pod IP (outside the cluster DNS)")
    la.set_defaults(fn=cmd_launch)

    k = sub.add_parser("k8s", help="Kubernetes tools")
    ksub = k.add_subparsers(dest="k8s_command", required=True, metavar="ACTION")
    kr = ksub.add_parser("render", help="write the job's Kubernetes objects as YAML, for review",
                         description="Write the job's RBAC, token Secret (placeholder value), master Service, master "
                                     "pod and the trainer pod template to --out, for "
                                     "review and `kubectl apply --dry-run=server`. The launcher creates the Secret "
                                     "(with the real token), the Service, the master pod and the trainer pods from "
                                     "the same builders, owned by its own pod; the RBAC is yours to apply.")
    add_job_arguments(kr)
    add_k8s_arguments(kr, POLICY_NAMES)
    kr.add_argument("--out", required=True, help="directory to write the YAML files into")
    kr.add_argument("--bind-account", dest="bind_accounts", action="append", default=[], metavar="ACCOUNT",
                    help="also bind the launcher's Role to this ServiceAccount of the namespace (repeatable): the "
                         "account the workflow runs its steps under, pipeline-runner in a standalone KFP install, "
                         "default-editor in a Kubeflow profile namespace, your CronWorkflow's own for Argo "
                         "(default: only edl-launcher, for `edl launch` in a pod of your own)")
    kr.add_argument("--bind-deployer", dest="deploy_accounts", action="append", default=[], metavar="ACCOUNT",
                    help="also write 01-deploy-rbac.yaml: a Role for the pipeline's deploy step (KServe "
                         "InferenceServices and their S3 Secret and ServiceAccount) bound to this ServiceAccount "
                         "(repeatable; only for pipelines run with deploy=True)")
    kr.set_defaults(fn=cmd_k8s_render)
