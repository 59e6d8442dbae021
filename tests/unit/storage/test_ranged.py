"""``RangedObject``: an object as a seekable file whose every read is one ranged read."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from edl.errors import StorageError
from edl.storage.store import RangedObject


def ranged(data: bytes, asked: list[tuple[int, int]], short: bool = False) -> RangedObject:
    def read_range(offset: int, length: int) -> bytes:
        asked.append((offset, length))
        return data[offset:offset + length - (1 if short else 0)]

    return RangedObject("s3://b/k", len(data), read_range)


def test_reads_seeks_and_the_end():
    asked: list[tuple[int, int]] = []
    f = ranged(bytes(range(100)), asked)
    assert f.seek(-10, io.SEEK_END) == 90 and f.read(4) == bytes([90, 91, 92, 93]) and f.tell() == 94
    assert f.read(100) == bytes(range(94, 100)) and f.read(1) == b""  # clipped at the end, then nothing
    assert f.seek(5) == 5 and f.seek(3, io.SEEK_CUR) == 8 and f.read(2) == bytes([8, 9])
    assert asked == [(90, 4), (94, 6), (8, 2)]  # only what was asked for, once each
    with pytest.raises(ValueError):
        f.seek(-1)


def test_a_short_answer_is_a_storage_error():
    f = ranged(b"x" * 10, [], short=True)
    with pytest.raises(StorageError, match="asked for 4 bytes at 0, got 3"):
        f.read(4)


def test_pyarrow_reads_one_row_group_with_one_ranged_read_after_the_footer():
    t = pa.table({"id": pa.array(range(10_000), pa.int64()), "x": pa.array([i / 3 for i in range(10_000)])})
    buf = io.BytesIO()
    pq.write_table(t, buf, row_group_size=1000)
    asked: list[tuple[int, int]] = []
    meta = pq.ParquetFile(ranged(buf.getvalue(), asked)).metadata
    assert len(asked) == 1 and asked[0][0] + asked[0][1] == len(buf.getvalue())  # the tail: the footer
    asked.clear()
    got = pq.ParquetFile(ranged(buf.getvalue(), asked), metadata=meta, pre_buffer=True).read_row_group(7)
    assert got.equals(t.slice(7000, 1000))
    rg = meta.row_group(7)
    assert [n for _, n in asked] == [sum(rg.column(i).total_compressed_size for i in range(rg.num_columns))]
