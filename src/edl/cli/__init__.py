"""The ``edl`` command. User errors end in one line on stderr and exit code 2.

One module per group of commands, each adding its own subcommands (``add_parsers``): ``local``
(train, status, scale), ``processes`` (master, trainer, sidecar: what launchers start), ``kube``
(launch, k8s render), ``simulate``, ``pipeline`` (demo, pipeline compile), ``serve``, ``data``.
"""

from __future__ import annotations

import argparse
import os
import sys

from edl.cli import data, kube, local, pipeline, processes, serve, simulate
from edl.errors import EdlError

# In the order ``edl --help`` lists them: a job on this machine, the processes of a job, Kubernetes,
# the simulator, pipelines and serving, data.
COMMAND_GROUPS = (local, processes, kube, simulate, pipeline, serve, data)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edl", description="Elastic deep learning for PaddlePaddle and PyTorch.")
    p.add_argument("--verbose", action="store_true",
                   help="also show the libraries' own logs: every HTTP request to the master, S3 and Kubernetes "
                        "(as EDL_VERBOSE=1 does); EDL_LOG_LEVEL=DEBUG shows edl's debug logs")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.add_parsers(sub)
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
