"""``edl master``, ``edl trainer`` and ``edl sidecar``: the processes a launcher starts, locally or in pods
(the job token from ``EDL_TOKEN``, never a flag)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import NoReturn

from edl.autoscale.policy import POLICY_NAMES
from edl.cli.common import add_kubeconfig, token_from_env
from edl.errors import EdlError, UserError
from edl.jobargs import FLAG_NAMES, add_job_arguments


# The flags ``edl sidecar`` names differently from ``edl launch``, by the field they set.
SIDECAR_FLAGS = FLAG_NAMES.with_names(sidecar_policy="--policy", sidecar_period_s="--period",
                                      sidecar_jitter_s="--jitter")


def cmd_master(a: argparse.Namespace) -> int:
    import time

    from edl.jobargs import spec_from_args
    from edl.master.main import run_master, wait_as_standby

    if not 0 < a.port < 65536:
        raise UserError(f"--port must be in 1..65535 (got {a.port})")
    spec, token = spec_from_args(a), token_from_env()
    woken_at = None
    if a.standby:
        # A spare: its imports are done; it reads, locks and serves nothing until it is told to start.
        if not wait_as_standby(spec, a.host, a.port, token):
            return 0
        woken_at = time.monotonic()
    return run_master(spec, a.host, a.port, token, woken_at=woken_at)


def cmd_trainer(a: argparse.Namespace) -> NoReturn:
    from edl.procs import leave_process

    # Every way out goes through ``leave_process``: the code is left for a launcher that adopted this
    # trainer (``edl.cluster.local``), and no interpreter teardown runs: Paddle's C++ threads that may
    # still run (a group forming for a prepared generation the master dropped, a collective left to
    # Gloo) abort the process when it destroys what they use, turning a clean exit into SIGABRT.
    try:
        code = _trainer(a)
    except EdlError as e:
        print(f"edl: error: {e}", file=sys.stderr)
        code = e.exit_code
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    leave_process(code)


def _trainer(a: argparse.Namespace) -> int:
    from edl.modeldef import require_any_framework

    if not a.id:
        raise UserError("--id is required (or set EDL_TRAINER_ID)")
    # Which one the model needs, the master says; with none here, say so before asking it.
    require_any_framework("a trainer needs one (on Kubernetes: run trainers from a trainer image, --trainer-image)")
    from edl.trainer.worker import run_trainer

    return run_trainer(a.id, a.master, token_from_env(), a.backend)


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
    return run_sidecar(a.job_name, a.master, token_from_env(), a.namespace, a.policy, a.period, a.jitter,
                       a.min_trainers, a.max_trainers, trainer, a.kubeconfig, selector, tolerated)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``master``, ``trainer`` and ``sidecar`` commands."""
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
    add_kubeconfig(sc2)
    sc2.set_defaults(fn=cmd_sidecar)
