"""The zoo's collate, framework-free: a ``features`` fixed-size list column and an integer ``label``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def collate(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    feats = table.column("features").combine_chunks()
    width = feats.type.list_size
    x = feats.values.to_numpy(zero_copy_only=False).reshape(-1, width).astype(np.float32, copy=False)
    y = table.column("label").to_numpy().astype(np.int64)
    return x, y


def collate_tokens(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """A ``tokens`` fixed-size list column of token ids (``edl data prepare tokens``) and the label."""
    toks = table.column("tokens").combine_chunks()
    x = toks.values.to_numpy(zero_copy_only=False).reshape(-1, toks.type.list_size).astype(np.int64, copy=False)
    y = table.column("label").to_numpy().astype(np.int64)
    return x, y
