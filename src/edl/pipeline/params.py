"""The elastic-train step's parameters, read from the component's signature without importing it.

KFP reads ``components.elastic_train``'s signature and runs the function's source in the image, so the
parameters are written out there, once. ``TrainParams`` (step.py) and the retraining pipeline's parameters
(retrain.py) derive from them; the step is what that component runs, so it cannot import the component
back. This module reads the signature from components.py's source with ``ast`` instead (names, types and
literal defaults, in order), and components.py checks at import that what it read is what KFP sees.
"""

import ast
import inspect
from pathlib import Path

_TYPES = {"str": str, "int": int, "float": float, "bool": bool}  # KFP's parameter types (not artifacts)


def read_parameters(source: str, function: str) -> tuple[inspect.Parameter, ...]:
    """The parameters (not the artifacts) of ``function`` as defined in ``source``, in their order:
    those annotated with one of KFP's parameter types, their defaults literals."""
    fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == function)
    args = fn.args.args
    defaults: list[ast.expr | None] = [None] * (len(args) - len(fn.args.defaults)) + list(fn.args.defaults)
    return tuple(
        inspect.Parameter(a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=_TYPES[a.annotation.id],
                          default=inspect.Parameter.empty if d is None else ast.literal_eval(d))
        for a, d in zip(args, defaults) if isinstance(a.annotation, ast.Name) and a.annotation.id in _TYPES)


def parameters_of(func) -> tuple[inspect.Parameter, ...]:
    """The parameters (not the artifacts) of a component's function (of the function a component
    wraps, or of the plain function in KFP's runtime mode), in their order."""
    return tuple(p for p in inspect.signature(getattr(func, "python_func", func)).parameters.values()
                 if p.annotation in _TYPES.values())


# elastic_train's parameters, in their order, with their types and defaults.
TRAIN_PARAMETERS = read_parameters(Path(__file__).with_name("components.py").read_text(), "elastic_train")
TRAIN_DEFAULTS: dict = {p.name: p.default for p in TRAIN_PARAMETERS}
