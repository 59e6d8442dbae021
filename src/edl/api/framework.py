"""The training framework as one seam: everything a trainer does with PaddlePaddle or PyTorch.

A trainer's loop (``edl.trainer.worker``) never touches a tensor. It asks its ``Framework``
for a ``Replica`` (the model and optimizer, built from the user's model definition under a
seed) and for each generation's ``Group`` (a process group formed from the master's
rendezvous); the replica steps, all-reduces its gradients in buckets through the group,
hands its state out as named numpy arrays and writes the export. Each framework lives in
``edl.frameworks.<name>`` and is the only code that imports it.

Arrays cross the seam as numpy, keyed by the model's structured parameter names
(``net.0.weight``), so a checkpoint, a warm start or ``params.npz`` reads the same whatever
process wrote it.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

# Parameters and optimizer arrays by structured name, and the optimizer's other (JSON) state.
Snapshot = tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]
# Queues a call on the collectives' thread and answers its future (``edl.trainer.collective.Runner.submit``).
Submit = Callable[[Callable[[], object]], Future]

FRAMEWORKS = ("paddle", "torch")  # the names of ``edl.frameworks.<name>``, and of the modules they import
FRAMEWORK_NAMES = {"paddle": "PaddlePaddle", "torch": "PyTorch"}
# What installs each (pyproject's extras); ``edl`` alone pulls neither.
FRAMEWORK_EXTRAS = {"paddle": "pip install 'edl[paddle]' (GPU: Paddle's CUDA wheel and 'edl[paddle-gpu]')",
                    "torch": "pip install 'edl[torch]'"}


class Group(Protocol):
    """One generation's process group. A failed call raises ``CollectiveError``; after ``abandon``
    every call raises ``Abandoned`` (``edl.errors``)."""

    rank: int
    world: int

    def all_reduce_sum(self, t: Any) -> None: ...

    def broadcast(self, t: Any, src: int = 0) -> None: ...

    def abandon(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Evaluation:
    loss: float  # the model definition's loss over every row
    metrics: dict[str, float]  # its metrics(); by default the loss and, for class scores, the accuracy
    # For class scores and integer labels: confusion[true][predicted] counts (the KFP UI's matrix).
    confusion: list[list[int]] | None = None


class Replica(Protocol):
    """A trainer's model and optimizer. A step is ``begin_step``, ``backward`` (each finished
    gradient bucket is submitted for its all-reduce while backward goes on), ``reduce_rest`` (the
    rest, with the step's slots riding in the last bucket) and ``end_step``."""

    trained: bool  # stepped or loaded since built

    def build(self) -> None:
        """A fresh model and optimizer: seeded, or from the warm start."""

    def warm_up(self, x: Any, y: np.ndarray) -> None:
        """One forward and backward on real rows (first-call costs paid now); the gradients are dropped."""

    def backward(self, x: Any, y: np.ndarray) -> float:
        """Accumulate the batch's summed per-sample gradients; answers its loss sum."""

    def begin_step(self, group: Group, slots: int, submit: Submit, abort: Callable[[], bool] | None = None) -> None:
        """Arm the next ``backward`` to stream its buckets; ``abort`` (the generation failed) is asked as
        backward goes, and where the framework's backward can be interrupted (PyTorch's) it stops there with
        ``Abandoned`` rather than finish a step that cannot complete."""

    def reduce_rest(self, group: Group, slots: np.ndarray, submit: Submit) -> Future:
        """Sum every gradient not summed yet and the slots; answers the future of the summed slots."""

    def end_step(self, samples: int) -> None:
        """Apply the summed gradients of ``samples`` rows (none: the model stays as it was)."""

    def drop_grads(self) -> None:
        """Forget a failed step's partly summed gradients."""

    def broadcast(self, group: Group, step: int) -> int:
        """Take rank 0's model, optimizer state and step (rank 0 sends its own); answers the step."""

    def snapshot(self) -> Snapshot: ...

    def restore(self, params: dict[str, np.ndarray], opt_arrays: dict[str, np.ndarray], extra: dict) -> None:
        """Load a checkpoint's state; ``ValueError`` when it does not fit the model."""

    def parameters(self) -> dict[str, np.ndarray]:
        """Copies of the parameters by structured name (``params.npz``)."""

    def set_parameters(self, params: dict[str, np.ndarray]) -> None:
        """Every parameter from ``params`` by structured name; ``ValueError`` when they do not fit."""

    def export(self, out: Path) -> str | None:
        """Write the framework's own inference model and ``model.onnx`` into the folder ``out``;
        answers why there is no ONNX model, or ``None``."""

    def evaluate(self, x: Any, y: np.ndarray) -> tuple[float, np.ndarray]:
        """The loss and the outputs (numpy) on every row, in eval mode without gradients."""


class Framework(Protocol):
    name: str  # one of FRAMEWORKS

    def replica(self, md: Any, seed: int, learning_rate: float, init_params: dict[str, np.ndarray] | None,
                bucket_bytes: int | None = None, first_bytes: int | None = None) -> Replica:
        """A replica of the model definition ``md`` (``edl.modeldef.ModelDef``); ``init_params`` warm-start it."""

    def group(self, host: str, port: int, rank: int, world: int, group_id: int, backend: str,
              timeout_s: int = 10) -> Group:
        """Form one generation's process group at the rendezvous ``host:port`` (rank 0 hosts its store)."""
