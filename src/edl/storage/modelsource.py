"""A model definition kept in S3 (``--model-def s3://BUCKET/path/model.py``): how a user's own
``model.py`` reaches trainer pods whose image does not hold it. Each process that loads the model
(every trainer, the pipeline's evaluation) reads the object itself; nothing is written to disk."""

from __future__ import annotations

from edl.errors import StorageError, UserError
from edl.modeldef import ModelDef, load_model_def
from edl.storage.store import open_store


def is_remote(spec: str) -> bool:
    return spec.startswith("s3://")


def model_def_source(spec: str) -> str | None:
    """The source text of the model definition ``spec`` when it is an S3 object; ``None`` for a module
    path or a local file (``edl.modeldef`` reads those). A missing or unreadable object is a
    ``UserError`` naming it; an unreachable store, after the store's retries, a ``StorageError``."""
    if not is_remote(spec):
        return None
    parent, _, name = spec.rpartition("/")
    if not name.endswith(".py") or parent.count("/") < 2:
        raise UserError(f"--model-def {spec!r}: an S3 model definition is a .py object, s3://BUCKET/path/model.py")
    store = open_store(parent, "--model-def")
    try:
        data = store.get(name)
    except StorageError:
        if not store.exists(name):  # a wrong name, not an unreachable store (which is retried, then raised)
            raise UserError(f"--model-def {spec!r}: no such object") from None
        raise
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"--model-def {spec!r} is not UTF-8 text: {e}") from e


def read_model_def(spec: str) -> ModelDef:
    """``load_model_def`` of ``spec``, wherever it is: a module, a local file or an S3 object."""
    return load_model_def(spec, model_def_source(spec))
