"""The ``edl`` command. User errors end in one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from edl.api.spec import JobSpec, K8sOptions
from edl.errors import EdlError, TemporaryError, UserError
from edl.jobargs import FLAG_NAMES

if TYPE_CHECKING:
    from edl.api.master import JobView
    from edl.console import Console

# The flags that only ``edl train`` and ``edl sidecar`` have, by the field they set.
TRAIN_FLAGS = FLAG_NAMES.with_names(autoscale_slots="--autoscale-slots", capacity_schedule="--capacity-schedule")
SIDECAR_FLAGS = FLAG_NAMES.with_names(sidecar_policy="--policy", sidecar_period_s="--period",
                                      sidecar_jitter_s="--jitter")


def _token_from_env() -> str:
    token = os.environ.get("EDL_TOKEN")
    if not token:
        raise UserError("EDL_TOKEN is not set (the job token comes from the environment, never from flags)")
    return token


def cmd_train(a: argparse.Namespace) -> int:
    from edl.api.spec import launcher_problems, local_autoscale_problems
    from edl.jobargs import spec_from_args
    from edl.launcher.local import LocalLauncher

    spec = spec_from_args(a)
    TRAIN_FLAGS.check(local_autoscale_problems(a.autoscale_slots, a.capacity_schedule, a.sidecar_period,
                                               spec.min_trainers), launcher_problems(a.max_trainer_failures))
    autoscale = None
    if a.autoscale_slots is not None:
        from edl.autoscale.local_view import CapacitySchedule
        from edl.launcher.local import LocalAutoscale

        autoscale = LocalAutoscale(a.autoscale_slots, CapacitySchedule.parse(a.capacity_schedule), a.sidecar_period)
    return LocalLauncher(spec, Path(a.summary_out) if a.summary_out else None, a.max_trainer_failures,
                         autoscale=autoscale).run()


def cmd_master(a: argparse.Namespace) -> int:
    import time

    from edl.jobargs import spec_from_args
    from edl.master.main import run_master, wait_as_standby

    if not 0 < a.port < 65536:
        raise UserError(f"--port must be in 1..65535 (got {a.port})")
    spec, token = spec_from_args(a), _token_from_env()
    woken_at = None
    if a.standby:
        # A spare: its imports are done; it reads, locks and serves nothing until it is told to start.
        if not wait_as_standby(spec, a.host, a.port, token):
            return 0
        woken_at = time.monotonic()
    return run_master(spec, a.host, a.port, token, woken_at=woken_at)


def cmd_trainer(a: argparse.Namespace) -> int:
    from edl.modeldef import require_any_framework

    if not a.id:
        raise UserError("--id is required (or set EDL_TRAINER_ID)")
    # Which one the model needs, the master says; with none here, say so before asking it.
    require_any_framework("a trainer needs one (on Kubernetes: run trainers from a trainer image, --trainer-image)")
    from edl.trainer.worker import run_trainer

    try:
        code = run_trainer(a.id, a.master, _token_from_env(), a.backend)
    except EdlError as e:
        print(f"edl: error: {e}", file=sys.stderr)
        code = e.exit_code
    # Leave at once: Paddle's C++ threads that may still run (a group forming for a prepared generation
    # the master dropped, a collective left to Gloo) abort the process when the interpreter's teardown
    # destroys what they use, which would turn a clean exit into SIGABRT.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _not_running(job: str) -> UserError:
    return UserError(f"job {job!r} is not running (its master does not answer)")


def cmd_status(a: argparse.Namespace) -> int:
    from edl.launcher.local import local_job_master

    st = local_job_master(a.job).status()
    if st is None:
        raise _not_running(a.job)
    if a.json:
        print(json.dumps(st.to_json(), indent=2))
        return 0
    from edl.console import plain_console

    show_status(plain_console(), st)
    return 0


def show_status(console: Console, st: JobView) -> None:
    """``edl status``: one line about the job, then a table of its trainers."""
    from edl.console import add_row, say, table

    say(console, (st.job, "bold"), f" {st.status.value} · phase {st.phase.value} · generation {st.generation} · "
        f"{st.world_size} trainers (desired {st.desired_trainers}, {st.min_trainers}..{st.max_trainers}) · "
        f"epoch {st.epoch + 1}/{st.epochs} · step {st.step}")
    t = table("trainer", "rank", "pid", "state", "step")
    for tr in st.trainers:
        add_row(t, tr.id, str(tr.rank), str(tr.pid), tr.state.value, str(tr.step))
    console.print(t)


def cmd_scale(a: argparse.Namespace) -> int:
    from edl.launcher.local import local_job_master

    try:
        desired = local_job_master(a.job).scale(a.trainers)
    except TemporaryError as e:
        raise _not_running(a.job) from e
    print(f"job {a.job}: desired trainers set to {desired}")
    return 0


def cmd_data_prepare(a: argparse.Namespace) -> int:
    from edl.data.prepare import prepare_digits, prepare_synthetic, prepare_tokens

    if a.kind == "digits":
        info = prepare_digits(a.out, shards=a.shards, seed=a.seed)
    elif a.kind == "tokens":
        info = prepare_tokens(a.out, a.rows, a.length, a.vocab, a.classes, shards=a.shards, seed=a.seed)
    else:
        info = prepare_synthetic(a.out, a.rows, a.features, a.classes, shards=a.shards, seed=a.seed)
    width = f"{info['features']} tokens of {a.vocab}" if a.kind == "tokens" else f"{info['features']} features"
    print(f"wrote {info['train_rows']} training rows to {a.out.rstrip('/')}/train and "
          f"{info['test_rows']} held-out rows to {a.out.rstrip('/')}/test "
          f"({width}, {info['classes']} classes)")
    return 0


def _pct(v: float | None, *bounds: float | None) -> str:
    """A utilization and, in brackets, the most a policy could reach (``edl.sim.bound``): with every
    pod packed, then (where known) around the services as they ran, and around the services and fixed
    pods as they ran (what placing trainers alone can reach)."""
    if v is None:
        return "-"
    known = [f"{100 * b:.1f}" for b in bounds if b is not None]
    return f"{100 * v:.1f}" + (f" ({' · '.join(known)})" if known else "")


def cmd_simulate(a: argparse.Namespace) -> int:
    from edl.console import plain_console
    from edl.files import write_json_atomic
    from edl.sim.report import plot, simulate
    from edl.sim.scenario import load

    if a.runs < 1:
        raise UserError(f"--runs must be at least 1 (got {a.runs})")
    if (a.scenario is None) == (a.generate is None):
        raise UserError("give either --scenario FILE or --generate N")
    policies = [p.strip() for p in a.compare.split(",")] if a.compare else [a.policy]
    known = _simulated_policies()
    for p in policies:
        if p not in known:
            raise UserError(f"unknown policy {p!r}; choose from {', '.join(known)}")
    if a.generate is not None:
        return _simulate_generated(a, policies)
    scenario = load(a.scenario)
    reports = []
    for p in policies:
        report, sim = simulate(scenario, p, a.runs, a.seed)
        reports.append(report)
        if a.plot:
            path = Path(a.plot)
            if len(policies) > 1:
                path = path.with_name(f"{path.stem}-{p}{path.suffix}")
            plot(sim, path, f"{scenario.name} · policy {p}")
    show_simulation(plain_console(), scenario.name, a.runs, reports)
    if a.out:
        write_json_atomic(Path(a.out), reports[0] if len(reports) == 1 else {"compare": reports})
    return 0


def show_simulation(console: Console, scenario: str, runs: int, reports: list[dict]) -> None:
    """``edl simulate``: one row per policy."""
    from edl.console import add_row, table, text

    t = table(*((c, "right") for c in ("policy", "util % (bounds)", "off-peak % (bounds)", "pending s", "JCT s",
                                       "Jain", "svc lag s", "rescales")),
              title=text(f"{scenario}: {runs} run(s) per policy"),
              caption="bounds: every pod packed · around the services as they ran · around the services "
                      "and fixed pods as they ran")
    for r in reports:
        u = r["utilization"]
        add_row(t, r["policy"],
                _pct(u["mean"], u["bound_mean"], u.get("job_pods_bound_mean"), u.get("trainers_bound_mean")),
                _pct(u["offpeak_mean"], u["bound_offpeak_mean"], u.get("job_pods_bound_offpeak_mean"),
                     u.get("trainers_bound_offpeak_mean")),
                f"{r['pending_s_mean']:.1f}", "-" if r["jct_s_mean"] is None else f"{r['jct_s_mean']:.0f}",
                f"{r['fairness_jain']:.2f}",
                "-" if not r["services"] else f"{max(s['lag_s_max'] for s in r['services']):.0f}",
                f"{r['rescale_events']:.0f}")
    console.print(t)


def _simulate_generated(a: argparse.Namespace, policies: list[str]) -> int:
    """``edl simulate --generate N --seed S``: the policies over generated scenarios S..S+N-1."""
    from edl.console import plain_console, table
    from edl.files import write_json_atomic
    from edl.sim.report import generated_benchmark

    if a.generate < 1:
        raise UserError(f"--generate must be at least 1 (got {a.generate})")
    console = plain_console()

    def progress(row: dict) -> None:
        cells = "  ".join(f"{p} {v['jct_s_mean']:.0f} s" for p, v in row["policies"].items())
        console.print(f"generated-{row['seed']}: {row['nodes']} nodes, {row['jobs']} jobs; mean JCT {cells}")

    result = generated_benchmark(list(range(a.seed, a.seed + a.generate)), policies, a.runs, bound=not a.no_bound,
                                 progress=progress)
    t = table(*((c, "right") for c in ("policies", "median", "worst", "best")),
              title=f"{a.generate} generated scenarios (seeds {a.seed}..{a.seed + a.generate - 1}): "
                    "mean-JCT ratios (below 1: faster)")
    for pair, v in result["summary"]["pairs"].items():
        t.add_row(pair, f"{v['median']:.3f}", f"{v['worst']:.3f}", f"{v['best']:.3f}")
    console.print(t)
    u = table(*((c, "right") for c in ("policy", "util/bound median", "util/bound worst", "svc lag periods median",
                                       "worst", "longest wait s", "unfinished jobs")),
              title="per policy")
    for p, v in result["summary"]["policies"].items():
        u.add_row(p, "-" if v["util_to_bound_median"] is None else f"{v['util_to_bound_median']:.3f}",
                  "-" if v["util_to_bound_worst"] is None else f"{v['util_to_bound_worst']:.3f}",
                  f"{v['lag_periods_median']:.1f}", f"{v['lag_periods_worst']:.1f}", f"{v['pending_s_worst']:.0f}",
                  str(v["unfinished_jobs"]))
    console.print(u)
    if a.out:
        write_json_atomic(Path(a.out), result)
    return 0


def cmd_sidecar(a: argparse.Namespace) -> int:
    from edl.api.cluster import Resources
    from edl.api.spec import (selector_pairs, sidecar_problems, toleration_triples, trainer_range_problems,
                              trainer_resource_problems)
    from edl.autoscale.policy import POLICY_NAMES
    from edl.autoscale.run import run_sidecar
    from edl.cluster.kube_objects import quantity

    SIDECAR_FLAGS.check(trainer_range_problems(a.min_trainers, a.max_trainers),
                        sidecar_problems(a.policy, a.period, a.jitter, POLICY_NAMES),
                        trainer_resource_problems(a.trainer_cpu, a.trainer_memory, a.trainer_gpu))
    trainer = Resources(quantity(a.trainer_cpu), quantity(a.trainer_memory) / 2 ** 30, float(a.trainer_gpu))
    try:
        selector = selector_pairs(a.trainer_node_selector)
    except ValueError as e:
        raise UserError(f"--trainer-node-selector {e}") from None
    try:
        tolerated = toleration_triples(a.trainer_tolerations)
    except ValueError as e:
        raise UserError(f"--trainer-tolerations {e}") from None
    return run_sidecar(a.job_name, a.master, _token_from_env(), a.namespace, a.policy, a.period, a.jitter,
                       a.min_trainers, a.max_trainers, trainer, a.kubeconfig, selector, tolerated)


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


def cmd_demo(a: argparse.Namespace) -> int:
    from edl.pipeline.demo import run_demo

    if a.epochs < 1:
        raise UserError(f"--epochs must be at least 1 (got {a.epochs})")
    from edl.modeldef import require_framework

    require_framework(a.framework, "edl demo trains on this machine")
    return run_demo(Path(a.out), a.epochs, framework=a.framework)


def cmd_serve(a: argparse.Namespace) -> int:
    import re

    if not 1 <= a.port <= 65535:
        raise UserError(f"--port must be 1..65535 (got {a.port})")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", a.name):
        raise UserError(f"--name {a.name!r}: letters, digits, '.', '_' and '-' only (it is part of the URL)")
    try:
        from edl.serving.server import serve
    except ImportError as e:
        raise UserError(f"edl serve needs the serve extra (pip install 'edl[serve]'): {e}") from None
    return serve(a.model_uri, a.port, a.name)


def cmd_pipeline_compile(a: argparse.Namespace) -> int:
    from edl.api.images import Images, registry_problem
    from edl.pipeline.compile import compile_all

    problem = registry_problem(a.registry)
    if problem:
        raise UserError(f"--registry {problem}")
    for path in compile_all(Path(a.out), Images(a.registry.rstrip("/"))):
        print(f"wrote {path}")
    return 0


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


def _add_kubeconfig(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig to use outside a cluster (default: in-cluster config, else ~/.kube/config)")


def _simulated_policies() -> tuple[str, ...]:
    """What ``edl simulate`` runs: "off" (static trainer counts) and every registered policy."""
    from edl.autoscale.policy import POLICY_NAMES

    return ("off", *POLICY_NAMES)


def build_parser() -> argparse.ArgumentParser:
    from edl.api.images import DEFAULT_REGISTRY, VERSION
    from edl.autoscale.policy import POLICY_NAMES
    from edl.jobargs import add_job_arguments, add_k8s_arguments

    p = argparse.ArgumentParser(prog="edl", description="Elastic deep learning for PaddlePaddle and PyTorch.")
    p.add_argument("--verbose", action="store_true",
                   help="also show the libraries' own logs: every HTTP request to the master, S3 and Kubernetes "
                        "(as EDL_VERBOSE=1 does); EDL_LOG_LEVEL=DEBUG shows edl's debug logs")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("train", help="run an elastic training job on this machine",
                       description="Run master and trainers as local processes until the job is done. "
                                   "Running the same command again resumes from the newest checkpoint.")
    add_job_arguments(t)
    t.add_argument("--summary-out", default=None, help="write the run summary (JSON) to this file")
    t.add_argument("--max-trainer-failures", type=int, default=5,
                   help="fail the job when trainers crash more than this many times with no training step "
                        "between the crashes: a step committed since the last crash, or 10 minutes since it, "
                        "forgives the earlier ones; 0: at the first crash (default 5)")
    t.add_argument("--autoscale-slots", type=int, default=None,
                   help="run the autoscale sidecar locally: this machine holds this many trainers (default: off)")
    t.add_argument("--capacity-schedule", default="",
                   help="other tenants taking slots over time, TIME:SLOTS pairs, e.g. 0:0,30:2,60:1 "
                        "(with --autoscale-slots)")
    t.add_argument("--sidecar-period", type=float, default=2.0,
                   help="seconds between the local sidecar's decisions, positive (default 2)")
    t.set_defaults(fn=cmd_train)

    m = sub.add_parser("master", help="run the job master (token from EDL_TOKEN)",
                       description="Serve the job's task queue, membership and checkpoints over HTTP.")
    add_job_arguments(m)
    m.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    m.add_argument("--port", type=int, default=8470, help="port to listen on (default 8470)")
    m.add_argument("--standby", action="store_true",
                   help="start up, then wait for a line on stdin before reading the job and serving it "
                        "(the local launcher's spare master: a restart without a Python start-up)")
    m.set_defaults(fn=cmd_master)

    w = sub.add_parser("trainer", help="run one trainer (token from EDL_TOKEN)",
                       description="Join the job at --master and train until the job ends or this trainer is drained.")
    w.add_argument("--id", default=os.environ.get("EDL_TRAINER_ID"),
                   help="unique id of this trainer process (default: $EDL_TRAINER_ID, the pod name on Kubernetes)")
    w.add_argument("--master", required=True, help="master address, host:port")
    w.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                   help="collective backend: gloo on CPU (default), nccl on GPUs")
    w.set_defaults(fn=cmd_trainer)

    s = sub.add_parser("status", help="show a running job", description="Show a running local job's state.")
    s.add_argument("job", help="job name")
    s.add_argument("--json", action="store_true", help="print the full status as JSON")
    s.set_defaults(fn=cmd_status)

    sc = sub.add_parser("scale", help="change a running job's desired trainer count",
                        description="Set the desired trainer count; refused outside the job's min..max.")
    sc.add_argument("job", help="job name")
    sc.add_argument("--trainers", type=int, required=True, help="the new desired trainer count")
    sc.set_defaults(fn=cmd_scale)

    sim = sub.add_parser("simulate", help="simulate a cluster with elastic jobs under a scaling policy",
                         description="Run a scenario in virtual time with the same policy code the sidecar runs.")
    sim.add_argument("--scenario", default=None, help="a scenario YAML file, or seed-case1 / seed-case2")
    sim.add_argument("--generate", type=int, default=None, metavar="N",
                     help="instead of --scenario: N generated scenarios (edl.sim.generate), seeds --seed.."
                          "--seed+N-1, each run --runs times; prints median and worst ratios")
    sim.add_argument("--no-bound", action="store_true", help="with --generate: skip the packing bound (faster)")
    sim.add_argument("--policy", default="edl", help=f"off (static trainer counts), {' or '.join(POLICY_NAMES)} "
                                                     "(default edl)")
    sim.add_argument("--compare", default=None,
                     help=f"comma-separated policies to run side by side, e.g. {','.join(_simulated_policies())}")
    sim.add_argument("--runs", type=int, default=1, help="runs with consecutive seeds, averaged (default 1)")
    sim.add_argument("--seed", type=int, default=0,
                     help="first seed (default 0): of the runs, or with --generate of the scenarios")
    sim.add_argument("--out", default=None, help="write the JSON report here")
    sim.add_argument("--plot", default=None, help="write a PNG of utilization, trainers, pending jobs and services")
    sim.set_defaults(fn=cmd_simulate)

    la = sub.add_parser("launch", help="run a job on Kubernetes (the elastic-train step's entrypoint)",
                        description="Create or adopt the job's token Secret, master pod (with its autoscale sidecar) "
                                    "and Service, keep the trainer pods at the master's desired count, and remove "
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
    _add_kubeconfig(la)
    la.add_argument("--master-via", choices=["service", "pod-ip"], default="service",
                    help="reach the master through its Service (default) or its pod IP (outside the cluster DNS)")
    la.set_defaults(fn=cmd_launch)

    sc2 = sub.add_parser("sidecar", help="run the autoscale sidecar next to a job's master (token from EDL_TOKEN)",
                         description="Watch nodes and pods, publish this job's demand in a Lease, read the peers', "
                                     "run the scaling policy and set the job's desired trainer count on the master.")
    sc2.add_argument("--job-name", required=True, help="the job this sidecar sizes")
    sc2.add_argument("--master", required=True, help="the job master's address, host:port")
    sc2.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "default"),
                     help="namespace of the job and its demand Lease (default: $POD_NAMESPACE or default)")
    sc2.add_argument("--policy", default="edl", help=f"scaling policy: {' or '.join(POLICY_NAMES)} (default edl)")
    sc2.add_argument("--period", type=float, default=10.0, help="seconds between decisions, positive (default 10)")
    sc2.add_argument("--jitter", type=float, default=2.0,
                     help="each job acts at a fixed offset in [0, jitter) seconds into the period, jitter below "
                          "--period; 0: no offset (default 2)")
    sc2.add_argument("--min-trainers", type=int, required=True, help="never below this many trainers")
    sc2.add_argument("--max-trainers", type=int, required=True, help="never above this many trainers")
    sc2.add_argument("--trainer-cpu", default="1", help="CPU request of one trainer pod (default 1)")
    sc2.add_argument("--trainer-memory", default="1Gi", help="memory request of one trainer pod (default 1Gi)")
    sc2.add_argument("--trainer-gpu", type=int, default=0, help="GPUs of one trainer pod; 0: CPU (default 0)")
    sc2.add_argument("--trainer-node-selector", default="",
                     help="KEY=VALUE,...: the trainers' nodeSelector; the plan counts only the nodes it selects")
    sc2.add_argument("--trainer-tolerations", default="",
                     help="KEY[=VALUE]:EFFECT,...: the trainers' tolerations; with them, the plan counts a tainted "
                          "node only if they tolerate its taints")
    _add_kubeconfig(sc2)
    sc2.set_defaults(fn=cmd_sidecar)

    de = sub.add_parser("demo", help="run the retraining pipeline on this machine (kfp.local), about a minute",
                        description="Prepare digits, train elastically while other tenants take and return trainer "
                                    "slots, evaluate on held-out data and publish the model to a local registry if "
                                    "it is better: the same KFP pipeline as on a cluster, run by kfp.local. Writes "
                                    "OUT/summary.json and OUT/timeline.png.")
    de.add_argument("--out", default="out/demo", help="directory for everything the run writes (default out/demo)")
    de.add_argument("--epochs", type=int, default=60, help="training epochs (default 60)")
    de.add_argument("--framework", choices=("paddle", "torch"), default="paddle",
                    help="train the digits model with PaddlePaddle (edl.zoo.digits) or PyTorch "
                         "(edl.zoo.torch.digits); default paddle")
    de.set_defaults(fn=cmd_demo)

    sv = sub.add_parser("serve", help="serve an exported model over the Open Inference Protocol (KServe v2 REST)",
                        description="Serve MODEL_URI/model.onnx (the ONNX file edl train exports beside the Paddle "
                                    "model) with ONNX Runtime on KServe's model server, until Ctrl-C or SIGTERM: "
                                    "GET /v2/models/NAME/ready, GET /v2/models/NAME (its tensors), POST "
                                    "/v2/models/NAME/infer. A request that does not fit the model's input gets "
                                    "400 with the reason.")
    sv.add_argument("model_uri", metavar="MODEL_URI",
                    help="an exported model directory: CHECKPOINT_URI/model, a registry's current/, a Model "
                         "artifact (a path, file:///dir or s3://bucket/prefix; S3 settings from the environment)")
    sv.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080, KServe's)")
    sv.add_argument("--name", default="model", help="the model's name in the routes (default model, KServe's)")
    sv.set_defaults(fn=cmd_serve)

    pl = sub.add_parser("pipeline", help="pipeline tools")
    plsub = pl.add_subparsers(dest="pipeline_command", required=True, metavar="ACTION")
    pc = plsub.add_parser("compile", help="write the KFP and Argo YAML of the retraining pipeline",
                          description="Compile the elastic-train component, the KFP retraining pipeline and the "
                                      "Argo CronWorkflow into --out.")
    pc.add_argument("--out", required=True, help="directory to write the YAML files into")
    pc.add_argument("--registry", default=DEFAULT_REGISTRY,
                    help="registry (and path) the edl images are pushed to: every step's image and the images of "
                         f"the training job's pods become REGISTRY/edl-NAME:{VERSION} (default {DEFAULT_REGISTRY})")
    pc.set_defaults(fn=cmd_pipeline_compile)

    k = sub.add_parser("k8s", help="Kubernetes tools")
    ksub = k.add_subparsers(dest="k8s_command", required=True, metavar="ACTION")
    kr = ksub.add_parser("render", help="write the job's Kubernetes objects as YAML, for review",
                         description="Write the job's RBAC, token Secret (placeholder value), master Service, master "
                                     "pod with its autoscale sidecar and the trainer pod template to --out, for "
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

    d = sub.add_parser("data", help="data set tools")
    dsub = d.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    dp = dsub.add_parser("prepare", help="write a ready-to-train data set (train/ and test/)",
                         description="Write Parquet shards with an integer id column: digits (scikit-learn's bundled "
                                     "8x8 digits), synthetic (float features labelled by a fixed random teacher) "
                                     "or tokens (token sequences labelled by a fixed random bag-of-words teacher, "
                                     "for the zoo's transformers).")
    dp.add_argument("kind", choices=["digits", "synthetic", "tokens"], help="which data set")
    dp.add_argument("--out", required=True, help="destination: a path, file:///dir or s3://bucket/prefix")
    dp.add_argument("--rows", type=int, default=20000,
                    help="synthetic, tokens: number of rows, at least 10 (default 20000)")
    dp.add_argument("--features", type=int, default=256, help="synthetic: input width, at least 1 (default 256)")
    dp.add_argument("--classes", type=int, default=10,
                    help="synthetic, tokens: number of classes, at least 2 (default 10)")
    dp.add_argument("--length", type=int, default=64, help="tokens: tokens per row, at least 1 (default 64)")
    dp.add_argument("--vocab", type=int, default=8192, help="tokens: vocabulary size, 2..2**24 (default 8192)")
    dp.add_argument("--shards", type=int, default=4,
                    help="Parquet files in train/, at least 1 and at most the training rows (default 4)")
    dp.add_argument("--seed", type=int, default=0, help="random seed, 0..2**32-1 (default 0)")
    dp.set_defaults(fn=cmd_data_prepare)
    return p


def main(argv: list[str] | None = None) -> int:
    from edl.console import VERBOSE_ENV, configure_logging

    args = build_parser().parse_args(argv)
    if args.verbose:
        os.environ[VERBOSE_ENV] = "1"  # for the processes this one starts (master, trainers, pipeline steps)
    configure_logging()
    try:
        return int(args.fn(args) or 0)
    except EdlError as e:
        print(f"edl: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("edl: interrupted", file=sys.stderr)
        return 130
