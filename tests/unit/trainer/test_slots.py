from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from edl.api.data import Cursor
from edl.trainer.slots import SLOT, StepSums, decode_cursor, decode_sums, encode_slot, own_slots


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


def test_the_summed_slots_decode_to_what_every_rank_contributed():
    members = ("a", "b", "c")
    parts = [own_slots(3, 0, Cursor(4, 16), 16, 8.0, False, True),
             own_slots(3, 1, None, 0, 0.0, True, True),
             own_slots(3, 2, Cursor(9, 3), 3, 1.5, False, True)]
    assert parts[1][:SLOT].sum() == 0 and parts[1][2 * SLOT:].sum() == 0  # only its own slot
    s = decode_sums(np.sum(parts, axis=0, dtype=np.float32), members)
    assert s == StepSums({"a": Cursor(4, 16), "b": None, "c": Cursor(9, 3)}, 19, 9.5, True, True, 0)
    one_left = [own_slots(2, 0, None, 0, 0.0, False, True), own_slots(2, 1, Cursor(1, 2), 2, 1.0, False, False)]
    s = decode_sums(np.sum(one_left, axis=0, dtype=np.float32), ("a", "b"))
    assert not s.finished and not s.stop and s.samples == 2


@given(st.integers(1, 2**30), st.integers(2, 6), st.data())
def test_the_switch_needs_every_rank_ready_for_the_same_prepared_generation(gen, world, data):
    members = tuple(f"t{r}" for r in range(world))
    ready = [gen] * world
    assert decode_sums(np.sum([own_slots(world, r, None, 1, 0.0, False, False, ready[r]) for r in range(world)],
                              axis=0, dtype=np.float32), members).switch_to == gen
    laggard = data.draw(st.integers(0, world - 1))
    ready[laggard] = data.draw(st.sampled_from([0, gen + 1]))  # not ready yet, or ready for another one
    s = decode_sums(np.sum([own_slots(world, r, None, 1, 0.0, False, False, ready[r]) for r in range(world)],
                           axis=0, dtype=np.float32), members)
    assert s.switch_to == 0
