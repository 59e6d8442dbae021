"""The container images of edl: the one place that names them.

Each image is built from its folder of ``images/`` (``images/NAME/Dockerfile`` -> ``edl-NAME``)
and tagged with the package's version, under a registry: ``REGISTRY/edl-NAME:VERSION``. Users
who push the images to their own registry set it once: ``edl pipeline compile --registry REG``
(every step of the pipeline and the CronWorkflow, and the images the training step's pods get),
or ``--image``/``--trainer-image``/``--trainer-gpu-image`` on ``edl launch``/``edl k8s render``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edl import __version__ as VERSION

# Where the published images live; a placeholder for a fork's own registry (ghcr.io/ORG).
DEFAULT_REGISTRY = "ghcr.io/edl-dev"

_REGISTRY = re.compile(r"^[a-z0-9]([a-z0-9.:-]*[a-z0-9])?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class Images:
    """edl's images under one registry, tagged with this package's version."""

    registry: str = DEFAULT_REGISTRY

    def _named(self, name: str) -> str:
        return f"{self.registry.rstrip('/')}/edl-{name}:{VERSION}"

    @property
    def runtime(self) -> str:
        """Launcher, master, autoscale sidecar and the light pipeline steps: no PaddlePaddle."""
        return self._named("runtime")

    @property
    def trainer_cpu(self) -> str:
        """PaddlePaddle trainers on CPUs (its CPU wheel); the pipeline's data preparation and evaluation too."""
        return self._named("trainer-cpu")

    @property
    def trainer_gpu(self) -> str:
        """PaddlePaddle trainers with ``trainer_gpu > 0`` (PaddlePaddle for CUDA, NCCL)."""
        return self._named("trainer-gpu")

    def trainer(self, framework: str, gpus: int) -> str:
        """The trainers' image for a model of ``framework`` (``edl.api.framework.FRAMEWORKS``) with
        ``gpus`` GPUs per trainer: PaddlePaddle's CPU and CUDA wheels are different packages, and
        PyTorch's CPU wheel is a tenth of the size of its CUDA build."""
        if framework == "paddle":
            return self.trainer_gpu if gpus > 0 else self.trainer_cpu
        return self._named(f"trainer-{framework}-{'gpu' if gpus > 0 else 'cpu'}")


DEFAULT_IMAGES = Images()


def registry_problem(registry: str) -> str | None:
    """Why ``registry`` is not a registry host with an optional path (``reg.example:5000/ml``), or ``None``."""
    if not _REGISTRY.match(registry.rstrip("/")):
        return f"{registry!r}: give a registry host and optional path, e.g. ghcr.io/my-org or reg.example:5000/ml"
    return None


def trainer_image_for(gpus: int, cpu_image: str, gpu_image: str) -> str:
    """The trainers' image: the GPU build when a trainer gets GPUs (a CPU wheel cannot use them)."""
    return gpu_image if gpus > 0 else cpu_image
