"""``edl master`` and ``edl trainer``: the processes a launcher starts, locally or in pods
(the job token from ``EDL_TOKEN``, never a flag)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import NoReturn

from edl.cli.common import token_from_env
from edl.errors import EdlError, UserError
from edl.jobargs import add_job_arguments


def cmd_master(a: argparse.Namespace) -> int:
    import time

    from edl.procs import end_on_sigterm_as_init

    end_on_sigterm_as_init()  # until uvicorn's own handler: the imports below take seconds

    from edl.jobargs import spec_from_args
    from edl.master.main import run_master, wait_as_standby, wait_as_standby_pod

    if not 0 < a.port < 65536:
        raise UserError(f"--port must be in 1..65535 (got {a.port})")
    spec, token = spec_from_args(a), token_from_env()
    woken_at, await_handover_s = None, 0.0
    # A spare: its imports are done; it reads, locks and serves nothing until it is told to start.
    if a.standby == "stdin":
        if not wait_as_standby(spec, a.host, a.port, token):
            return 0
        woken_at = time.monotonic()
    elif a.standby == "http":
        wake = wait_as_standby_pod(spec, a.host, a.port, token, a.serving_master)
        if wake is None:
            return 0
        woken_at, await_handover_s = time.monotonic(), wake
    return run_master(spec, a.host, a.port, token, woken_at=woken_at, await_handover_s=await_handover_s)


def cmd_trainer(a: argparse.Namespace) -> NoReturn:
    from edl.procs import end_on_sigterm_as_init, leave_process

    end_on_sigterm_as_init()  # until the trainer's own (draining) handler: its framework's import takes seconds

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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``master`` and ``trainer`` commands."""
    m = sub.add_parser("master", help="run the job master (token from EDL_TOKEN)",
                       description="Serve the job's task queue, membership and checkpoints over HTTP.")
    add_job_arguments(m)
    m.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    m.add_argument("--port", type=int, default=8470, help="port to listen on (default 8470)")
    m.add_argument("--standby", nargs="?", const="stdin", choices=["stdin", "http"], default=None,
                   help="a spare master: start up, then wait to be woken before reading the job and serving it "
                        "(a restart without a Python start-up). stdin (the default): woken by a line on stdin "
                        "(the local launcher's spare); http: woken by POST /v1/standby/start with the job token "
                        "at --host:--port (a spare master pod, woken by the launcher)")
    m.add_argument("--serving-master", default=None, metavar="HOST:PORT",
                   help="with --standby http: the serving master's address (the job's Service), asked every 5 s "
                        "whether the job is over or abandoned by its launcher: the spare then ends too")
    m.set_defaults(fn=cmd_master)

    w = sub.add_parser("trainer", help="run one trainer (token from EDL_TOKEN)",
                       description="Join the job at --master and train until the job ends or this trainer is drained.")
    w.add_argument("--id", default=os.environ.get("EDL_TRAINER_ID"),
                   help="unique id of this trainer process (default: $EDL_TRAINER_ID, the pod name on Kubernetes)")
    w.add_argument("--master", required=True, help="master address, host:port")
    w.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                   help="collective backend: gloo on CPU (default), nccl on GPUs")
    w.set_defaults(fn=cmd_trainer)
