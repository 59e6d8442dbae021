"""The gradient buckets: the packing plan (pure), and the replica's fused all-reduce against plain Paddle."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edl.modeldef import load_model_def
from edl.trainer.buckets import FIRST_BYTES, Bucket, plan_buckets
from edl.trainer.collective import Group, Runner
from edl.trainer.replica import Replica
from edl.trainer.slots import own_slots

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


# ---------------------------------------------------------------- the replica against plain Paddle
def _batches(n: int, rows: int = 12) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((rows, 64)).astype(np.float32), rng.integers(0, 10, rows).astype(np.int64))
            for _ in range(n)]


def _plain_steps(batches: list[tuple[np.ndarray, np.ndarray] | None]) -> dict[str, np.ndarray]:
    """What the steps should give: the unfused path, parameter by parameter (summed per-sample
    gradients, scaled to the mean, Paddle's optimizer step and ``clear_grad``)."""
    md = load_model_def("edl.zoo.digits")
    paddle.seed(3)
    np.random.seed(3)
    model = md.model()
    opt = md.optimizer(model.parameters(), 0.01)
    for batch in batches:
        if batch is None:
            continue  # nobody had data: the model stays as it was
        x, y = batch
        (md.loss(model(paddle.to_tensor(x)), paddle.to_tensor(y)) * len(y)).backward()
        with paddle.no_grad():
            for p in model.parameters():
                p.grad.scale_(1.0 / len(y))
        opt.step()
        opt.clear_grad()
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def _replica_steps(batches: list[tuple[np.ndarray, np.ndarray] | None], fail_after: int | None = None,
                   overlap: bool = False) -> tuple[Replica, list[np.ndarray]]:
    """Steps through ``Replica.all_reduce`` on this thread, or (``overlap``) as the trainer does: the
    buckets sent from backward's hooks to a ``Runner``'s thread, small buckets so that there are several."""
    sizes = {"bucket_bytes": 16384, "first_bytes": 1024} if overlap else {}
    r = Replica(load_model_def("edl.zoo.digits"), 3, 0.01, **sizes)
    warm = _batches(1, rows=4)[0]
    r.warm_up(*warm)  # leaves Paddle's own (replaced) gradients behind, as in the trainer
    group = Group("127.0.0.1", 0, 0, 1, 0)  # world 1: the sum is the identity
    runner = Runner()
    summed = []
    for i, batch in enumerate(batches):
        count = 0
        slots = own_slots(1, 0, None, len(batch[1]) if batch else 0, 1.5, False, False)
        if overlap:
            r.begin_step(group, len(slots), runner.submit)
        if batch is not None:
            r.backward(*batch)
            count = len(batch[1])
        if overlap:
            if batch is not None:
                assert len(r._flats) == 3 and len(r._sent) == 2  # sent during backward, the slots' bucket not
            summed.append(runner.wait(r.reduce_rest(group, slots, runner.submit), lambda: False))
        else:
            summed.append(r.all_reduce(group, slots))
        if i == fail_after:
            continue  # the collective "failed": the generation ends without end_step
        r.end_step(count)
    return r, summed


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlapped"])
def test_fused_steps_train_the_model_exactly_as_plain_paddle(overlap):
    batches = _batches(4)
    steps = [batches[0], batches[1], None, batches[2], batches[3]]
    r, summed = _replica_steps(steps, overlap=overlap)
    want = _plain_steps(steps)
    got = {k: v.numpy() for k, v in r.model.state_dict().items()}
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)  # the same arithmetic
    assert [int(s[4]) for s in summed] == [12, 12, 0, 12, 12]  # the slots come back exact


def test_gradients_are_the_summed_per_sample_gradients_after_the_all_reduce():
    (x, y), = _batches(1)
    r = Replica(load_model_def("edl.zoo.digits"), 3, 0.01)
    r.backward(x, y)
    r.all_reduce(Group("127.0.0.1", 0, 0, 1, 0), own_slots(1, 0, None, len(y), 0.0, False, False))
    ref = load_model_def("edl.zoo.digits")
    paddle.seed(3)
    np.random.seed(3)
    model = ref.model()
    (ref.loss(model(paddle.to_tensor(x)), paddle.to_tensor(y)) * len(y)).backward()
    for p, q in zip(r.params, model.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlapped"])
def test_a_step_whose_all_reduce_failed_leaves_nothing_in_the_next_step(overlap):
    batches = _batches(3)
    r, _ = _replica_steps([batches[0], batches[1], batches[2]], fail_after=1, overlap=overlap)
    want = _plain_steps([batches[0], batches[2]])
    for k, v in r.model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), want[k], err_msg=k)
