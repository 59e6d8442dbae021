"""``edl data prepare``: write ready-to-train data sets (no downloads)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from edl.api.spec import MAX_SEED
from edl.errors import UserError
from edl.storage.store import open_store

# Trainers read a shard one row group at a time (ranged reads) and hold the groups they use in memory:
# groups of a few MB keep a read cheap and the memory small whatever the shard's size.
ROW_GROUP_BYTES = 4 << 20


def rows_per_group(features: int) -> int:
    # float32 features (or int32 tokens) and a definition level each (a list column), int64 id and label
    return max(1, ROW_GROUP_BYTES // (features * 9 // 2 + 16))


def _table(ids: np.ndarray, x: np.ndarray, y: np.ndarray) -> pa.Table:
    """float inputs as ``features``; integer ones (token ids) as ``tokens``."""
    column = "tokens" if np.issubdtype(x.dtype, np.integer) else "features"
    values = x.astype(np.int32 if column == "tokens" else np.float32).ravel()
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            column: pa.FixedSizeListArray.from_arrays(pa.array(values), x.shape[1]),
            "label": pa.array(y.astype(np.int64)),
        }
    )


def _write(uri: str, split: str, ids: np.ndarray, x: np.ndarray, y: np.ndarray, shards: int) -> int:
    store = open_store(uri, "--out")
    store.check()
    n = len(ids)
    bounds = np.linspace(0, n, shards + 1).astype(int)
    for i in range(shards):
        lo, hi = bounds[i], bounds[i + 1]
        buf = io.BytesIO()
        pq.write_table(_table(ids[lo:hi], x[lo:hi], y[lo:hi]), buf, row_group_size=rows_per_group(x.shape[1]))
        store.put(f"{split}/part-{i:05d}.parquet", buf.getvalue())
    return n


def _check_layout(shards: int, seed: int) -> None:
    """Before anything is generated or written."""
    if shards < 1:
        raise UserError(f"--shards must be at least 1 (got {shards})")
    if not 0 <= seed <= MAX_SEED:
        raise UserError(f"--seed must be in 0..{MAX_SEED} (got {seed})")


def split_and_write(uri: str, x: np.ndarray, y: np.ndarray, test_fraction: float, shards: int, seed: int) -> dict:
    _check_layout(shards, seed)
    if shards > len(x) - int(round(len(x) * test_fraction)):
        raise UserError(f"--shards {shards} is more than the {len(x) - int(round(len(x) * test_fraction))} "
                        "training rows: every shard needs at least one")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    ids = np.arange(len(x))
    n_train = _write(uri, "train", ids[train], x[train], y[train], shards)
    n_te = _write(uri, "test", ids[test], x[test], y[test], max(1, shards // 4))
    return {"train_rows": n_train, "test_rows": n_te, "features": x.shape[1], "classes": int(y.max()) + 1}


def prepare_digits(uri: str, shards: int = 4, seed: int = 0) -> dict:
    """scikit-learn's bundled 8x8 digits (1,797 images), scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    _check_layout(shards, seed)
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    return split_and_write(uri, x, d.target, 0.2, shards, seed)


def prepare_synthetic(uri: str, rows: int, features: int, classes: int, shards: int = 8, seed: int = 0) -> dict:
    """Gaussian inputs labelled by a fixed random two-layer teacher, so a model can learn it."""
    if rows < 10:
        raise UserError(f"--rows must be at least 10 (got {rows})")
    if features < 1:
        raise UserError(f"--features must be at least 1 (got {features})")
    if classes < 2:
        raise UserError(f"--classes must be at least 2 (got {classes})")
    _check_layout(shards, seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features)).astype(np.float32)
    w1 = rng.standard_normal((features, 64)) / np.sqrt(features)
    w2 = rng.standard_normal((64, classes)) / 8.0
    y = np.argmax(np.tanh(x @ w1) @ w2, axis=1)
    return split_and_write(uri, x, y, 0.1, shards, seed)


def prepare_tokens(uri: str, rows: int, length: int, vocab: int, classes: int, shards: int = 8,
                   seed: int = 0) -> dict:
    """Token sequences (Zipf-distributed ids, as text's are) labelled by a fixed random bag-of-words
    teacher: each token votes for the classes with its own random weights; the label is the winner.
    For the zoo's transformers (``edl.zoo.transformer``, ``edl.zoo.torch.transformer``)."""
    if rows < 10:
        raise UserError(f"--rows must be at least 10 (got {rows})")
    if length < 1:
        raise UserError(f"--length must be at least 1 (got {length})")
    if not 2 <= vocab <= 1 << 24:
        raise UserError(f"--vocab must be in 2..{1 << 24} (got {vocab})")
    if classes < 2:
        raise UserError(f"--classes must be at least 2 (got {classes})")
    _check_layout(shards, seed)
    rng = np.random.default_rng(seed)
    x = ((rng.zipf(1.3, (rows, length)) - 1) % vocab).astype(np.int32)
    votes = rng.standard_normal((vocab, classes)).astype(np.float32)
    y = np.argmax(votes[x].sum(axis=1), axis=1)
    return split_and_write(uri, x, y, 0.1, shards, seed)
