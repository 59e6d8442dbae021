"""The gradient buckets' packing plan (pure); the replicas' fused steps are ``test_replica_steps``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edl.frameworks.buckets import FIRST_BYTES, Bucket, plan_buckets

DTYPES = st.sampled_from(["float32", "float16", "float64"])


@given(st.lists(st.tuples(st.integers(1, 5000), DTYPES), max_size=30), st.integers(0, 40),
       st.integers(64, 40000), st.integers(64, 40000), st.randoms(use_true_random=False))
def test_every_parameter_is_in_exactly_one_bucket_of_its_dtype_closed_once_it_reached_its_size(
        params, slots, size, first, rnd):
    ready = list(range(len(params)))
    rnd.shuffle(ready)
    plan = plan_buckets(params, slots, bucket_bytes=size, first_bytes=first, ready=ready)
    seen = [i for b in plan for i in b.params]
    assert sorted(seen) == list(range(len(params)))
    item = {"float32": 4, "float16": 2, "float64": 8}
    rank = {i: k for k, i in enumerate(ready)}
    for b in plan:
        assert all(params[i][1] == b.dtype for i in b.params)
        assert [params[i][0] for i in b.params] == list(b.sizes)
        assert [rank[i] for i in b.params] == sorted(rank[i] for i in b.params)  # backward's order
        if b.params:  # closed only after reaching its size: without its last parameter it was under it
            assert sum(b.sizes[:-1]) * item[b.dtype] < max(first, size)
    assert sum(b.slots for b in plan) == slots
    if slots:  # the slots ride last, in float32, which keeps them exact
        assert plan[-1].slots == slots and plan[-1].dtype == "float32"


def test_the_wide_mlp_is_one_bucket_per_big_layer_in_backward_order_with_the_slots_at_the_end():
    sizes = [256 * 1024, 1024, 1024 * 1024, 1024, 1024 * 1024, 1024, 1024 * 10, 10]
    plan = plan_buckets([(n, "float32") for n in sizes], 16, first_bytes=FIRST_BYTES, ready=range(7, -1, -1))
    # Each layer's weight stays with its bias (backward makes them together), and the first bucket
    # closes with the third layer's weight, so that its sum overlaps the first two layers' backward.
    assert [(b.params, b.slots) for b in plan] == [((7, 6, 5, 4), 0), ((3, 2), 0), ((1, 0), 16)]
    b = plan[-1]
    assert b.offsets == (0, 1024) and b.numel == 1024 + 256 * 1024 + 16


def test_the_first_bucket_closes_at_its_own_size_the_later_ones_at_theirs():
    plan = plan_buckets([(5, "float32")] * 6, 0, bucket_bytes=40, first_bytes=20)
    assert [b.params for b in plan] == [(0,), (1, 2), (3, 4), (5,)]


def test_a_small_size_splits_the_model_in_order():
    plan = plan_buckets([(10, "float32"), (10, "float32"), (30, "float32"), (5, "float32")], 2, bucket_bytes=80)
    assert [(b.params, b.slots) for b in plan] == [((0, 1), 0), ((2,), 0), ((3,), 2)]


def test_slots_get_a_bucket_of_their_own_when_no_gradient_is_float32():
    plan = plan_buckets([(10, "float64")], 8)
    assert plan == (Bucket("float64", (0,), (10,)), Bucket("float32", (), (), 8))


def test_slots_ride_in_the_last_float32_bucket_when_the_gradients_filled_their_buckets_exactly():
    plan = plan_buckets([(20, "float32"), (20, "float32"), (10, "float64")], 4, bucket_bytes=80)
    assert [(b.params, b.dtype, b.slots) for b in plan] == [((0,), "float32", 0), ((2,), "float64", 0),
                                                             ((1,), "float32", 4)]


def test_sizes_must_be_positive_and_ready_must_name_every_parameter():
    with pytest.raises(ValueError):
        plan_buckets([(1, "float32")], 0, bucket_bytes=0)
    with pytest.raises(ValueError):
        plan_buckets([(1, "float32"), (1, "float32")], 0, ready=[1, 1])
