from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from edl.api.data import Cursor
from edl.trainer.slots import SLOT, decode_cursor, encode_slot


@given(st.integers(0, 2**40), st.integers(0, 2**30))
def test_cursor_survives_a_float32_sum(task_id, offset):
    world = 3
    buf = np.zeros(world * SLOT, dtype=np.float32)
    parts = []
    for r in range(world):
        p = np.zeros_like(buf)
        p[r * SLOT : (r + 1) * SLOT] = encode_slot(Cursor(task_id + r, offset), 16, 1.5, r == 1, False)
        parts.append(p)
    total = np.sum(parts, axis=0, dtype=np.float32).reshape(world, SLOT)
    for r in range(world):
        assert decode_cursor(total[r]) == Cursor(task_id + r, offset)
    assert total[:, 6].sum() == 1


def test_no_cursor_is_none():
    assert decode_cursor(np.array(encode_slot(None, 0, 0.0, False, False), dtype=np.float32)) is None
