"""``edl serve``: an exported model over the Open Inference Protocol."""

from __future__ import annotations

import argparse

from edl.errors import UserError


def cmd_serve(a: argparse.Namespace) -> int:
    import ipaddress
    import re

    if not 1 <= a.port <= 65535:
        raise UserError(f"--port must be 1..65535 (got {a.port})")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", a.name):
        raise UserError(f"--name {a.name!r}: letters, digits, '.', '_' and '-' only (it is part of the URL)")
    try:
        ipaddress.ip_address(a.host)
    except ValueError:
        raise UserError(f"--host {a.host!r}: not an IP address (e.g. 0.0.0.0, or the pod's own)") from None
    try:
        from edl.serving.server import serve
    except ImportError as e:
        raise UserError(f"edl serve needs the serve extra (pip install 'edl[serve]'): {e}") from None
    return serve(a.model_uri, a.port, a.name, a.host)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``serve`` command."""
    sv = sub.add_parser("serve", help="serve an exported model over the Open Inference Protocol (KServe v2 REST)",
                        description="Serve MODEL_URI/model.onnx (the ONNX file edl train exports beside the "
                                    "framework's own model) with ONNX Runtime on KServe's model server, until Ctrl-C or SIGTERM: "
                                    "GET /v2/models/NAME/ready, GET /v2/models/NAME (its tensors), POST "
                                    "/v2/models/NAME/infer. A request that does not fit the model's input gets "
                                    "400 with the reason.")
    sv.add_argument("model_uri", metavar="MODEL_URI",
                    help="an exported model directory: CHECKPOINT_URI/model, a registry's current/, a Model "
                         "artifact; or a model repository holding NAME/VERSION/model.onnx (the deploy step's, "
                         "Triton's layout: the highest version is served). A path, file:///dir or "
                         "s3://bucket/prefix; S3 settings from the environment")
    sv.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080, KServe's)")
    sv.add_argument("--host", default="0.0.0.0",
                    help="the address to listen on (default 0.0.0.0: every address, as KServe's model server does; "
                         "a pod's own address where pods share one network)")
    sv.add_argument("--name", default="model", help="the model's name in the routes (default model, KServe's)")
    sv.set_defaults(fn=cmd_serve)
