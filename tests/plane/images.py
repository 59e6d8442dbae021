"""The images the loopback kubelet can "pull": edl's own, read from ``images/*/Dockerfile``.

An image ``[registry/][path/]edl-NAME:VERSION`` (VERSION: the package's, from pyproject.toml)
runs its command from this machine's Python environment (where ``edl`` is installed), with
the ``ENV``, ``ENTRYPOINT`` and ``CMD`` of its Dockerfile. Argo's executor image
``quay.io/argoproj/argoexec:ARGO_VERSION`` is the ``argoexec`` binary built from Argo's module
(``tools/argo``), once built. Any other reference is an image this node cannot pull
(ErrImagePull, then ImagePullBackOff), as on a cluster without it.
"""

from __future__ import annotations

import json
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARGO_VERSION = "v4.0.5"
ARGOEXEC_IMAGE = f"quay.io/argoproj/argoexec:{ARGO_VERSION}"


@dataclass(frozen=True)
class Image:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    path: str = ""  # PATH inside the "container"


def _dockerfile(path: Path) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    env: dict[str, str] = {}
    entry: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    stage_env: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":  # only the last stage is the image
            stage_env, entry, cmd = {}, (), ()
        elif word == "ENV":
            for tok in shlex.split(rest):
                k, _, v = tok.partition("=")
                stage_env[k] = v
        elif word == "ENTRYPOINT":
            entry = tuple(json.loads(rest))
        elif word == "CMD":
            cmd = tuple(json.loads(rest))
    env.update(stage_env)
    return env, entry, cmd


def version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def catalogue() -> dict[str, Image]:
    """``edl-NAME:VERSION`` -> Image, for every folder of ``images/``."""
    bin_dir = str(Path(sys.executable).parent)
    path = f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    out = {}
    for dockerfile in sorted((REPO / "images").glob("*/Dockerfile")):
        env, entry, cmd = _dockerfile(dockerfile)
        name = f"edl-{dockerfile.parent.name}:{version()}"
        out[name] = Image(name, env, entry, cmd, path)
    from tests.plane import build

    if build.ARGOEXEC.built():
        name = ARGOEXEC_IMAGE.rsplit("/", 1)[-1]
        out[name] = Image(name, {}, ("argoexec",), (), f"{build.ARGOEXEC.out_dir()}:/usr/bin:/bin")
    return out


def resolve(reference: str, known: dict[str, Image]) -> Image | None:
    """The image a pod names, whatever registry it is qualified with; ``None`` if not known here."""
    last = reference.rsplit("/", 1)[-1]
    return known.get(last)
