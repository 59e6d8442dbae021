"""What several commands share: the job token from the environment, the kubeconfig flag."""

from __future__ import annotations

import argparse
import os

from edl.errors import UserError


def token_from_env() -> str:
    token = os.environ.get("EDL_TOKEN")
    if not token:
        raise UserError("EDL_TOKEN is not set (the job token comes from the environment, never from flags)")
    return token


def add_kubeconfig(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig to use outside a cluster (default: in-cluster config, else ~/.kube/config)")
