"""The pipeline's small steps, as plain functions: data, evaluation, the publish decision.

A *registry* is a directory or s3:// prefix: ``current/`` holds the published model's
files, ``current.json`` its accuracy and origin. Retraining warm-starts from
``REGISTRY/current`` and publishes only a better model.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from edl.errors import UserError
from edl.storage.store import open_store

CURRENT = "current"
CURRENT_INFO = "current.json"


def prepare_dataset(kind: str, out: str, rows: int, seed: int, metadata: dict | None = None) -> dict:
    from edl.data.prepare import prepare_digits, prepare_synthetic

    if kind == "digits":
        info = prepare_digits(out, seed=seed)
    elif kind == "synthetic":
        info = prepare_synthetic(out, rows, 64, 10, seed=seed)
    else:
        raise UserError(f"pipeline parameter data_kind: {kind!r}; choose digits or synthetic")
    if metadata is not None:
        metadata.update({k: v for k, v in info.items() if isinstance(v, (int, float, str))})
    return info


def evaluate_model(model_dir: str, data_uri: str, model_def: str) -> dict[str, float]:
    """Accuracy and loss of a model directory (params.npz) on the held-out split of ``data_uri``."""
    return evaluate_model_in_full(model_dir, data_uri, model_def)[0]


def evaluate_model_in_full(model_dir: str, data_uri: str,
                           model_def: str) -> tuple[dict[str, float], list[list[int]] | None]:
    """``evaluate_model``'s metrics and the confusion matrix (row: true class, column: predicted;
    ``None`` when the outputs are not class scores)."""
    from edl.data.dataset import Dataset
    from edl.data.splits import resolve_splits
    from edl.storage.checkpoint import WARM_START_FILE, decode_arrays
    from edl.storage.modelsource import read_model_def
    from edl.frameworks import framework_of, load
    from edl.trainer.export import evaluate

    md = read_model_def(model_def)
    path = Path(model_dir) / WARM_START_FILE
    if not path.exists():
        raise UserError(f"model {model_dir}: no {WARM_START_FILE} (not a model written by edl)")
    replica = load(framework_of(md)).replica(md, 0, 0.0, None)
    try:
        replica.set_parameters(decode_arrays(path.read_bytes()))
    except ValueError as e:
        raise UserError(f"model {model_dir} does not match model_def {model_def}: {e}") from None
    _, test = resolve_splits(data_uri)
    if test is None:
        raise UserError(f"data {data_uri}: no held-out split (test/) to evaluate on")
    ev = evaluate(md, replica, Dataset(test, "held-out data").read_all())
    result = dict(ev.metrics)
    result.setdefault("loss", ev.loss)
    if "accuracy" not in result:
        why = "its metrics() returned no 'accuracy'" if md.metrics is not None else "its outputs are not class scores"
        raise UserError(f"model_def {model_def}: {why}")
    return result, ev.confusion


def published(registry_uri: str) -> dict | None:
    store = open_store(registry_uri, "registry_uri")
    if not store.exists(CURRENT_INFO):
        return None
    return json.loads(store.get(CURRENT_INFO))


def beats_published(accuracy: float, registry_uri: str) -> bool:
    current = published(registry_uri)
    return current is None or accuracy > float(current["accuracy"])


def publish_model(model_dir: str, accuracy: float, registry_uri: str, source: str = "") -> str:
    """Copy the model files to REGISTRY/current/, then write current.json last (readers trust it)."""
    store = open_store(registry_uri, "registry_uri")
    files = sorted(p for p in Path(model_dir).rglob("*") if p.is_file())
    if not files:
        raise UserError(f"model {model_dir}: no files to publish")
    store.check()  # the first publish into a registry bucket that does not exist yet creates it
    for f in files:
        store.put(f"{CURRENT}/{f.relative_to(model_dir).as_posix()}", f.read_bytes())
    info = {"accuracy": accuracy, "published_at": time.time(), "source": source,
            "files": [f.relative_to(model_dir).as_posix() for f in files]}
    store.put(CURRENT_INFO, json.dumps(info, indent=2).encode())
    return store.child(CURRENT)


def warm_start_uri(registry_uri: str) -> str:
    """``REGISTRY/current`` when a model is published there, else "" (train from scratch)."""
    if not registry_uri or published(registry_uri) is None:
        return ""
    return open_store(registry_uri, "registry_uri").child(CURRENT)


WARM_START_INFO = "warm_start.json"  # in the lookup step's Model artifact: what it chose, and why


def lookup_warm_start(registry_uri: str, enabled: bool, into: Path, metadata: dict, own_uri: str) -> str:
    """The registry lookup step: the URI of the Model artifact to warm-start from, for the importer
    that hands it to training (so that the new model's lineage links to it).

    That is the published model's own Model artifact (``source`` in ``current.json``: the run that
    published it) where its files are still there, else the registry's copy (``REGISTRY/current``).
    With nothing published, or ``enabled`` off, it is ``own_uri``: this step's own artifact ``into``,
    which holds only ``warm_start.json`` saying ``published: false`` (train from scratch; an importer
    takes no empty URI). ``metadata`` (the step artifact's) and ``warm_start.json`` say which, the
    source, the copy and the published accuracy."""
    info = published(registry_uri) if enabled and registry_uri else None
    into.mkdir(parents=True, exist_ok=True)
    if info is None:
        chosen = own_uri
        metadata.update({"published": False, "reason": "warm start off" if not enabled else "nothing published yet"})
    else:
        copy = open_store(registry_uri, "registry_uri").child(CURRENT)
        source = str(info.get("source") or "")
        chosen = source if source and holds_model_files(source) else copy
        metadata.update({"published": True, "registry_uri": copy, "source": source, "warm_start": chosen,
                         "accuracy": float(info["accuracy"]), "published_at": float(info.get("published_at", 0))})
    (into / WARM_START_INFO).write_text(json.dumps(metadata, indent=2))
    return chosen


def holds_model_files(artifact: str) -> bool:
    """Whether the model artifact at ``artifact`` (a KFP artifact URI: ``minio://``/``s3://`` on a
    cluster, a local path in kfp.local) still holds an exported model edl can read. A URI edl cannot
    read (``gs://``, a store that refuses this step's credentials) counts as gone: the caller falls
    back to the registry's copy rather than hand training a model nobody can read."""
    from edl.errors import EdlError
    from edl.pipeline.artifacts import artifact_uri
    from edl.storage.checkpoint import WARM_START_FILE

    try:
        return open_store(artifact_uri(artifact, artifact), "model artifact").exists(WARM_START_FILE)
    except EdlError:
        return False


def download_model(uri: str, into: Path, what: str = "model") -> Path:
    """Copy the model directory at ``uri`` (an exported model, a registry's ``current/``) into ``into``."""
    store = open_store(uri, what)
    names = store.list("")
    if not names:
        raise UserError(f"{what} {uri}: no files there")
    for name in names:
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_bytes(store.get(name))
    return into


def evaluate_remote(model_uri: str, data_uri: str, model_def: str) -> float:
    """``evaluate_model`` for a model in an object store (the Argo workflow's evaluate step)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return evaluate_model(str(download_model(model_uri, Path(tmp))), data_uri, model_def)["accuracy"]


def publish_if_better(model_uri: str, accuracy: float, registry_uri: str) -> str | None:
    """The Argo workflow's last step: publish only a model that beats the current one."""
    import tempfile

    if not beats_published(accuracy, registry_uri):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        return publish_model(str(download_model(model_uri, Path(tmp))), accuracy, registry_uri, model_uri)
