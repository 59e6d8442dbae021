"""The user's model definition: a module or a ``.py`` file given by ``--model-def``.

Inspired by ElasticDL's model-zoo contract, made plain Python. The module defines:

``model() -> paddle.nn.Layer | torch.nn.Module``
    Build the network. Called once per trainer, after the framework's seed. What it returns
    says which framework trains it (``edl.frameworks``).
``loss(outputs, labels) -> Tensor``
    The mean loss of a batch.
``optimizer(parameters, learning_rate) -> paddle.optimizer.Optimizer | torch.optim.Optimizer``
``collate(table: pyarrow.Table) -> (inputs, labels)``
    Turn a batch of records into numpy arrays (``inputs`` may be a tuple of arrays).
``metrics(outputs, labels) -> dict[str, float]`` (optional)
    Held-out metrics; the default reports ``loss`` and, when the outputs are
    class scores, ``accuracy``.
"""

from __future__ import annotations

import ast
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

from edl.api.framework import FRAMEWORK_EXTRAS, FRAMEWORK_NAMES, FRAMEWORKS
from edl.errors import EdlError, UserCodeError, UserError

REQUIRED = ("model", "loss", "optimizer", "collate")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a half-removed package
        return False


def require_framework(name: str, where: str) -> None:
    """A ``UserError`` naming the extra to install when framework ``name`` (``paddle``, ``torch``)
    cannot be found in this Python; ``where`` says why it is needed here. Found without importing
    it (seconds of a launcher's start): one that is there but broken fails in the trainer, with its
    own message."""
    if not _installed(name):
        raise UserError(f"{FRAMEWORK_NAMES[name]} is not installed in this Python ({sys.executable}), and {where}: "
                        f"{FRAMEWORK_EXTRAS[name]}")


def require_any_framework(where: str) -> None:
    """A ``UserError`` naming the extras when no training framework is installed in this Python."""
    if not any(_installed(name) for name in FRAMEWORKS):
        raise UserError(f"neither PaddlePaddle nor PyTorch is installed in this Python ({sys.executable}), and "
                        f"{where}: {' or '.join(FRAMEWORK_EXTRAS[n].split(' (')[0] for n in FRAMEWORKS)}")


def _source(spec: str) -> str | None:
    """The source text of a model definition, found without running it; ``None`` when not found."""
    try:
        if spec.endswith(".py") or "/" in spec:
            return Path(spec).read_text()
        mspec = importlib.util.find_spec(spec)
        if mspec is None or mspec.origin is None or not mspec.origin.endswith(".py"):
            return None
        return Path(mspec.origin).read_text()
    except (ImportError, ValueError, OSError, UnicodeDecodeError):
        return None  # the trainer imports it and says what is wrong


def frameworks_imported(spec: str) -> set[str]:
    """The training frameworks (``FRAMEWORKS``) that a model definition's source imports; read with
    ``ast``, not run, so it works where the framework is not installed (a launcher)."""
    text = _source(spec)
    if text is None:
        return set()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.partition(".")[0])
    return roots & set(FRAMEWORKS)


def framework_of_source(spec: str) -> str | None:
    """The one training framework a model definition's source imports; ``None`` when it imports
    neither or both (a helper module may hide it) or its source is not here (``frameworks_imported``)."""
    found = frameworks_imported(spec)
    return found.pop() if len(found) == 1 else None


def require_frameworks_of(spec: str, where: str) -> None:
    """``require_framework`` for each framework the model definition imports (see ``frameworks_imported``)."""
    for name in sorted(frameworks_imported(spec)):
        require_framework(name, f"--model-def {spec} imports {name} ({where})")


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


def _import(spec: str, source: str | None = None) -> ModuleType:
    if source is not None:  # read by the caller (an S3 object: ``edl.storage.modelsource``)
        module = ModuleType(f"edl_user_model_{abs(hash(spec))}")
        module.__file__ = spec
        sys.modules[module.__name__] = module
        exec(compile(source, spec, "exec"), module.__dict__)  # noqa: S102 - the user's model, as an import runs it
        return module
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


def load_model_def(spec: str, source: str | None = None) -> ModelDef:
    """Import and check a model definition; any problem is a one-line ``UserError``. ``source``: its
    text, where the caller read it (``spec`` then only names it)."""
    try:
        module = _import(spec, source)
    except UserError:
        raise
    except ModuleNotFoundError as e:
        root = (e.name or "").partition(".")[0]
        if root in FRAMEWORKS:
            require_framework(root, f"--model-def {spec!r} imports it")
        raise UserError(f"--model-def {spec!r} cannot be imported: {type(e).__name__}: {e}") from e
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
