"""The user's model definition: a module or a ``.py`` file given by ``--model-def``.

Inspired by ElasticDL's model-zoo contract, made plain Python. The module defines:

``model() -> paddle.nn.Layer``
    Build the network. Called once per trainer, after ``paddle.seed``.
``loss(outputs, labels) -> paddle.Tensor``
    The mean loss of a batch.
``optimizer(parameters, learning_rate) -> paddle.optimizer.Optimizer``
``collate(table: pyarrow.Table) -> (inputs, labels)``
    Turn a batch of records into numpy arrays (``inputs`` may be a tuple of arrays).
``metrics(outputs, labels) -> dict[str, float]`` (optional)
    Held-out metrics; the default reports ``loss`` and, when the outputs are
    class scores, ``accuracy``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, TypeVar

from edl.errors import EdlError, UserCodeError, UserError

REQUIRED = ("model", "loss", "optimizer", "collate")
TRAINER_EXTRA = "pip install 'edl[trainer]'"  # pyproject's extra with PaddlePaddle (CPU) for the trainers


def require_paddle(where: str) -> None:
    """A ``UserError`` naming the extra to install when PaddlePaddle cannot be found in this Python;
    ``where`` says why it is needed here. Found without importing it (seconds of a launcher's start):
    a Paddle that is there but broken fails in the trainer, with its own message."""
    try:
        found = importlib.util.find_spec("paddle") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a half-removed package
        found = False
    if not found:
        raise UserError(f"PaddlePaddle is not installed in this Python ({sys.executable}), and {where}: "
                        f"{TRAINER_EXTRA} (GPU: Paddle's CUDA wheel and 'edl[trainer-gpu]')")


F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def user_code(model_def: str, part: str) -> Iterator[None]:
    """Run a call into the user's code: what it raises becomes a ``UserCodeError`` naming ``part``.

    edl's own errors and ``MemoryError`` (the machine, not the code) pass through unchanged."""
    try:
        yield
    except (EdlError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - the user's code can raise anything
        raise UserCodeError(model_def, part, e) from e


def _guarded(model_def: str, part: str, fn: F) -> F:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with user_code(model_def, part):
            return fn(*args, **kwargs)

    return call  # type: ignore[return-value]


@dataclass(frozen=True)
class ModelDef:
    """The user's functions; each call raises ``UserCodeError`` for what the user's code raises."""

    name: str
    module: ModuleType
    model: Callable[[], Any]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[Any, float], Any]
    collate: Callable[[Any], tuple[Any, Any]]
    metrics: Callable[[Any, Any], dict] | None

    def forward(self, model: Any, *inputs: Any) -> Any:
        """The model's forward pass (the user's ``Layer.forward``)."""
        with user_code(self.name, "the model's forward"):
            return model(*inputs)

    def backward(self, loss: Any) -> None:
        """The backward pass through the user's graph."""
        with user_code(self.name, "the backward pass"):
            loss.backward()


def _import(spec: str) -> ModuleType:
    if spec.endswith(".py") or "/" in spec:
        path = Path(spec)
        if not path.is_file():
            raise UserError(f"--model-def {spec!r}: no such file")
        name = f"edl_user_model_{abs(hash(str(path.resolve())))}"
        mspec = importlib.util.spec_from_file_location(name, path)
        if mspec is None or mspec.loader is None:
            raise UserError(f"--model-def {spec!r}: cannot be loaded as Python")
        module = importlib.util.module_from_spec(mspec)
        sys.modules[name] = module
        mspec.loader.exec_module(module)
        return module
    return importlib.import_module(spec)


def load_model_def(spec: str) -> ModelDef:
    """Import and check a model definition; any problem is a one-line ``UserError``."""
    try:
        module = _import(spec)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's import can raise anything
        raise UserError(f"--model-def {spec!r} cannot be imported: {type(e).__name__}: {e}") from e
    missing = [f for f in REQUIRED if not callable(getattr(module, f, None))]
    if missing:
        raise UserError(f"--model-def {spec!r} does not define {', '.join(missing)} (see `edl train --help`)")
    metrics = getattr(module, "metrics", None)
    return ModelDef(
        name=spec,
        module=module,
        model=_guarded(spec, "model()", module.model),
        loss=_guarded(spec, "loss()", module.loss),
        optimizer=_guarded(spec, "optimizer()", module.optimizer),
        collate=_guarded(spec, "collate()", module.collate),
        metrics=_guarded(spec, "metrics()", metrics) if callable(metrics) else None,
    )
