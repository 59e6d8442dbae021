"""Data sets: directories of Parquet files with an integer ``id`` column.

``URI`` may point at the files themselves or at a prepared data set with
``train/`` and ``test/`` below it (then ``train/`` is used for training and
``test/`` is the default held-out set).

Shards are read where they lie, never copied: from S3 by ranged reads of a
shard's footer (its row groups and row counts) and of the row groups a row
range needs, through pyarrow's Parquet reader over the store's seekable file.
A pod's scratch space (an emptyDir with a size limit) holds none of the data
set, and memory holds the footers and a bounded cache of decoded row groups.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from edl.errors import EdlError, UserError
from edl.api.data import Shard
from edl.data import splits
from edl.storage.store import FileStore, ObjectStore, open_store

resolve_splits = splits.resolve_splits  # its old home, for callers that import it from here

CACHE_BYTES = 256 * 2**20  # decoded row groups kept; at least the last one read is kept whatever its size


def group_span(starts: list[int], start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """The row groups holding rows ``[start, end)`` of a shard whose groups begin at ``starts`` (with the
    shard's row count last): ``(group, first, stop)``, rows ``[first, stop)`` of that group."""
    group = max(bisect.bisect_right(starts, start) - 1, 0)
    while group < len(starts) - 1 and starts[group] < end:
        lo, hi = max(start, starts[group]), min(end, starts[group + 1])
        if hi > lo:
            yield group, lo - starts[group], hi - starts[group]
        group += 1


class Dataset:
    """Lists shards, validates them, and reads row ranges straight from the store (footers and the
    row groups a range needs, with a cache of decoded row groups). Thread-safe: the trainer's prefetch
    warms the groups of its next tasks while the loop reads."""

    def __init__(self, uri: str, what: str = "--data", cache_bytes: int = CACHE_BYTES) -> None:
        self.uri = uri
        self.what = what
        self.store: ObjectStore = open_store(uri, what)
        self._cache_bytes = cache_bytes
        self._lock = threading.Lock()  # guards the dicts below; reads run outside it
        self._meta: dict[str, pq.FileMetaData] = {}
        self._sizes: dict[str, int] = {}  # of the shards opened through the store: no HEAD per row group
        self._starts: dict[str, list[int]] = {}
        self._groups: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()
        self._held = 0  # bytes of the cached groups
        self._loading: dict[tuple[str, int], threading.Lock] = {}

    # ------------------------------------------------------------ reading a shard
    def _corrupt(self, name: str, e: Exception) -> UserError:
        return UserError(f"corrupt Parquet shard {self.store.child(name)}: {e}")

    def _open(self, name: str, metadata: pq.FileMetaData | None = None) -> pq.ParquetFile:
        """A reader of shard ``name``; with ``metadata`` (its footer, read before) nothing is read yet.
        ``pre_buffer`` turns the column chunks of a row group into one ranged read."""
        source: str | BinaryIO
        if isinstance(self.store, FileStore):
            source = str(self.store.root / name)
        else:
            with self._lock:
                size = self._sizes.get(name)
            source = self.store.open_ranged(name, size)
            if size is None and hasattr(source, "size"):
                with self._lock:
                    self._sizes[name] = source.size()
        try:
            return pq.ParquetFile(source, metadata=metadata, pre_buffer=True)
        except EdlError:
            raise
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types here
            raise self._corrupt(name, e) from e

    def metadata(self, name: str) -> pq.FileMetaData:
        """Shard ``name``'s footer: read once (the footer's bytes only), then kept."""
        with self._lock:
            meta = self._meta.get(name)
        if meta is None:
            with self._open(name) as pf:
                meta = pf.metadata
            with self._lock:
                self._meta[name] = meta
                self._starts[name] = [0]
                for i in range(meta.num_row_groups):
                    self._starts[name].append(self._starts[name][-1] + meta.row_group(i).num_rows)
        return meta

    def _group(self, name: str, group: int) -> pa.Table:
        """Row group ``group`` of shard ``name``, from the cache or one ranged read."""
        key = (name, group)
        with self._lock:
            table = self._groups.get(key)
            if table is not None:
                self._groups.move_to_end(key)
                return table
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:  # a second reader of the same group waits for the first instead of reading it again
            try:
                with self._lock:
                    table = self._groups.get(key)
                if table is None:
                    table = self._read_group(name, group)
                    with self._lock:
                        self._groups[key] = table
                        self._held += table.nbytes
                        while self._held > self._cache_bytes and len(self._groups) > 1:
                            _, old = self._groups.popitem(last=False)
                            self._held -= old.nbytes
            finally:
                with self._lock:
                    self._loading.pop(key, None)
        return table

    def _read_group(self, name: str, group: int) -> pa.Table:
        meta = self.metadata(name)
        try:
            with self._open(name, meta) as pf:
                return pf.read_row_group(group)
        except EdlError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._corrupt(name, e) from e

    # ------------------------------------------------------------ the data set
    def shards(self) -> list[Shard]:
        """Every shard with its row count (from the footers only); a ``UserError`` for a missing, empty or
        corrupt set."""
        if isinstance(self.store, FileStore) and not self.store.root.exists():
            raise UserError(f"{self.what} {self.uri} does not exist")
        names = [k for k in self.store.list("") if k.endswith(".parquet")]
        if not names:
            raise UserError(f"{self.what} {self.uri} holds no .parquet files")
        shards = []
        for name in names:
            meta = self.metadata(name)
            try:
                schema = meta.schema.to_arrow_schema()
            except Exception as e:  # noqa: BLE001
                raise self._corrupt(name, e) from e
            if "id" not in schema.names:
                raise UserError(f"Parquet shard {self.store.child(name)} has no 'id' column")
            if not pa.types.is_integer(schema.field("id").type):
                raise UserError(f"Parquet shard {self.store.child(name)}: column 'id' is not an integer")
            if meta.num_rows > 0:
                shards.append(Shard(name, meta.num_rows))
        if not shards:
            raise UserError(f"{self.what} {self.uri} is empty (0 rows)")
        return shards

    def rows(self, shard: str, start: int, end: int) -> pa.Table:
        """Rows ``[start, end)`` of ``shard``: only the row groups that hold them are read."""
        meta = self.metadata(shard)
        with self._lock:
            starts = self._starts[shard]
        parts = [self._group(shard, g).slice(lo, hi - lo) for g, lo, hi in group_span(starts, start, end)]
        if not parts:
            return meta.schema.to_arrow_schema().empty_table()
        return pa.concat_tables(parts) if len(parts) > 1 else parts[0]

    def warm(self, shard: str, start: int, end: int) -> None:
        """Read ahead the row groups of rows ``[start, end)`` into the cache (the trainer's prefetch)."""
        self.metadata(shard)
        with self._lock:
            starts = self._starts[shard]
        for g, _, _ in group_span(starts, start, end):
            self._group(shard, g)

    def _whole(self, name: str, columns: list[str] | None = None) -> pa.Table:
        try:
            with self._open(name, self.metadata(name)) as pf:
                return pf.read(columns=columns)
        except EdlError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._corrupt(name, e) from e

    def all_ids(self) -> list[int]:
        """Every record id, shard by shard (only the ``id`` column is read)."""
        ids: list[int] = []
        for s in self.shards():
            ids.extend(self._whole(s.name, ["id"]).column("id").to_pylist())
        return ids

    def read_all(self) -> pa.Table:
        """The whole set in memory (the held-out set, for the final metrics)."""
        return pa.concat_tables([self._whole(s.name) for s in self.shards()])
