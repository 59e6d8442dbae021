"""Where a data set's training and held-out rows are: one listing, no Parquet reader.

Apart from ``edl.data.dataset`` so that what only needs the answer (a restarted master) does not
import pyarrow.
"""

from __future__ import annotations

from edl.storage.store import open_store


def resolve_splits(uri: str) -> tuple[str, str | None]:
    """Where the training rows of ``uri`` are, and its held-out rows if it has some: ``uri`` itself if it
    holds Parquet files, else ``uri/train`` if that does, with ``uri/test`` if that does (for ``uri`` =
    ``PARENT/train``: ``PARENT/test``). One listing decides both (two for ``PARENT/train``)."""
    store = open_store(uri, "--data")
    keys = store.list("")
    train, test = _parquet_in(keys, "train/"), _parquet_in(keys, "test/")
    if not _parquet_in(keys, "") and (train or test):
        return store.child("train") if train else uri, store.child("test") if test else None
    if uri.endswith("/train"):
        parent = open_store(uri.rsplit("/train", 1)[0], "--data")
        parent_keys = parent.list("")
        if not _parquet_in(parent_keys, "") and _parquet_in(parent_keys, "test/"):
            return uri, parent.child("test")
    return uri, None


def _parquet_in(keys: list[str], split: str) -> bool:
    """Whether Parquet files lie in ``split`` ("train/", "test/"; "": directly in the listed prefix)."""
    if not split:
        return any(k.endswith(".parquet") and "/" not in k for k in keys)
    return any(k.startswith(split) and k.endswith(".parquet") for k in keys)
