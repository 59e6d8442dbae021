"""``edl demo`` and ``edl pipeline compile``: the retraining pipeline run on this machine, and compiled."""

from __future__ import annotations

import argparse
from pathlib import Path

from edl.api.images import DEFAULT_REGISTRY, VERSION
from edl.errors import UserError


def cmd_demo(a: argparse.Namespace) -> int:
    from edl.pipeline.demo import run_demo

    if a.epochs < 1:
        raise UserError(f"--epochs must be at least 1 (got {a.epochs})")
    from edl.modeldef import require_framework

    require_framework(a.framework, "edl demo trains on this machine")
    return run_demo(Path(a.out), a.epochs, framework=a.framework)


def cmd_pipeline_compile(a: argparse.Namespace) -> int:
    from edl.api.images import Images, registry_problem
    from edl.pipeline.compile import compile_all

    problem = registry_problem(a.registry)
    if problem:
        raise UserError(f"--registry {problem}")
    for path in compile_all(Path(a.out), Images(a.registry.rstrip("/"))):
        print(f"wrote {path}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``demo`` and ``pipeline compile`` commands."""
    de = sub.add_parser("demo", help="run the retraining pipeline on this machine (kfp.local), about a minute",
                        description="Prepare digits, train elastically while other tenants take and return trainer "
                                    "slots, evaluate on held-out data and publish the model to a local registry if "
                                    "it is better: the same KFP pipeline as on a cluster, run by kfp.local. Writes "
                                    "OUT/summary.json and OUT/timeline.png.")
    de.add_argument("--out", default="out/demo", help="directory for everything the run writes (default out/demo)")
    de.add_argument("--epochs", type=int, default=150, help="training epochs (default 150: about 25 s of training on "
                    "2 cores, long enough for the tenants' slot to be taken and given back)")
    de.add_argument("--framework", choices=("paddle", "torch"), default="paddle",
                    help="train the digits model with PaddlePaddle (edl.zoo.digits) or PyTorch "
                         "(edl.zoo.torch.digits); default paddle")
    de.set_defaults(fn=cmd_demo)

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
