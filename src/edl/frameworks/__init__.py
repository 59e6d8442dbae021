"""The training frameworks behind ``edl.api.framework``: which one a model definition uses, and loading it.

``edl.frameworks.paddle`` and ``edl.frameworks.torch`` are the only modules that import
PaddlePaddle and PyTorch (``.importlinter``); this module imports neither: it finds a
model's framework from the classes of what ``model()`` returns.
"""

from __future__ import annotations

import importlib
from typing import Any

from edl.api.framework import FRAMEWORK_NAMES, FRAMEWORKS, Framework
from edl.errors import UserError
from edl.modeldef import ModelDef, require_framework


def of_object(obj: object) -> str | None:
    """The framework whose class ``obj`` is (a model, an optimizer), or ``None``."""
    for cls in type(obj).__mro__:
        root = cls.__module__.partition(".")[0]
        if root in FRAMEWORKS:
            return root
    return None


def load(name: str) -> Framework:
    """The framework ``name`` (one of ``FRAMEWORKS``); a ``UserError`` naming its extra when missing."""
    if name not in FRAMEWORKS:
        raise UserError(f"unknown framework {name!r} (one of {', '.join(FRAMEWORKS)})")
    require_framework(name, "the trainer needs it")
    return importlib.import_module(f"edl.frameworks.{name}").FRAMEWORK


def framework_of(md: ModelDef) -> str:
    """The framework of the model that ``md.model()`` builds; a one-line ``UserError`` when it is neither's."""
    model: Any = md.model()
    name = of_object(model)
    if name is None:
        raise UserError(f"--model-def {md.name}: model() returned a {type(model).__module__}.{type(model).__name__}, "
                        f"neither a paddle.nn.Layer nor a torch.nn.Module")
    return name


def check_one_framework(md: ModelDef, name: str, part: str, obj: object) -> None:
    """A one-line ``UserError`` when ``obj``, which ``part`` of the user's code returned, is another
    framework's than the model's ``name``."""
    other = of_object(obj)
    if other is not None and other != name:
        raise UserError(f"--model-def {md.name} mixes frameworks: model() returns a {FRAMEWORK_NAMES[name]} model, "
                        f"{part} a {FRAMEWORK_NAMES[other]} {type(obj).__name__}")
