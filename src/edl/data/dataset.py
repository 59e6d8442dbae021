"""Data sets: directories of Parquet files with an integer ``id`` column.

``URI`` may point at the files themselves or at a prepared data set with
``train/`` and ``test/`` below it (then ``train/`` is used for training and
``test/`` is the default held-out set).
"""

from __future__ import annotations

import tempfile
from collections import OrderedDict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from edl.errors import UserError
from edl.api.data import Shard
from edl.storage.store import FileStore, ObjectStore, open_store


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


class Dataset:
    """Lists shards, validates them, and reads row ranges (with a small table cache)."""

    def __init__(self, uri: str, what: str = "--data", cache_tables: int = 8) -> None:
        self.uri = uri
        self.what = what
        self.store: ObjectStore = open_store(uri, what)
        self._cache: OrderedDict[str, pa.Table] = OrderedDict()
        self._cache_size = cache_tables
        self._tmp: Path | None = None

    def _local(self, name: str) -> Path:
        if isinstance(self.store, FileStore):
            return self.store.root / name
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="edl-data-"))
        path = self._tmp / name
        if not path.exists():
            self.store.get_to_file(name, path)
        return path

    def shards(self) -> list[Shard]:
        """Every shard with its row count; a ``UserError`` for a missing, empty or corrupt set."""
        if isinstance(self.store, FileStore) and not self.store.root.exists():
            raise UserError(f"{self.what} {self.uri} does not exist")
        names = [k for k in self.store.list("") if k.endswith(".parquet")]
        if not names:
            raise UserError(f"{self.what} {self.uri} holds no .parquet files")
        shards = []
        for name in names:
            path = self._local(name)
            try:
                meta = pq.ParquetFile(path)
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types here
                raise UserError(f"corrupt Parquet shard {self.store.child(name)}: {e}") from e
            if "id" not in meta.schema_arrow.names:
                raise UserError(f"Parquet shard {self.store.child(name)} has no 'id' column")
            if not pa.types.is_integer(meta.schema_arrow.field("id").type):
                raise UserError(f"Parquet shard {self.store.child(name)}: column 'id' is not an integer")
            if meta.metadata.num_rows > 0:
                shards.append(Shard(name, meta.metadata.num_rows))
        if not shards:
            raise UserError(f"{self.what} {self.uri} is empty (0 rows)")
        return shards

    def table(self, shard: str) -> pa.Table:
        t = self._cache.get(shard)
        if t is None:
            try:
                t = pq.read_table(self._local(shard))
            except Exception as e:  # noqa: BLE001
                raise UserError(f"corrupt Parquet shard {self.store.child(shard)}: {e}") from e
            self._cache[shard] = t
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(shard)
        return t

    def rows(self, shard: str, start: int, end: int) -> pa.Table:
        return self.table(shard).slice(start, end - start)

    def all_ids(self) -> list[int]:
        ids: list[int] = []
        for s in self.shards():
            ids.extend(self.table(s.name).column("id").to_pylist())
        return ids

    def read_all(self) -> pa.Table:
        return pa.concat_tables([self.table(s.name) for s in self.shards()])
