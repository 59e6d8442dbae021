"""Each framework's replica, stepped through its fused buckets, against the same steps done plainly.

The replica makes every gradient a view of its place in a flat bucket, sums the buckets (from
backward's hooks, on a ``Runner``'s thread, when overlapped) and scales them to the mean: the
model must come out exactly as parameter-by-parameter steps leave it, in PaddlePaddle and in
PyTorch alike.
"""

from __future__ import annotations

import numpy as np
import pytest

from edl.errors import Abandoned
from edl.frameworks import load
from edl.modeldef import load_model_def
from edl.trainer.collective import Runner
from edl.trainer.slots import own_slots

MODELS = {"paddle": "edl.zoo.digits", "torch": "edl.zoo.torch.digits"}
pytestmark = pytest.mark.parametrize("framework", sorted(MODELS))


def _batches(n: int, rows: int = 12) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((rows, 64)).astype(np.float32), rng.integers(0, 10, rows).astype(np.int64))
            for _ in range(n)]


def _plain_paddle(batches: list[tuple[np.ndarray, np.ndarray] | None], grads_only: bool = False) -> dict[str, np.ndarray]:
    import paddle

    md = load_model_def(MODELS["paddle"])
    paddle.seed(3)
    model = md.model()
    opt = md.optimizer(model.parameters(), 0.01)
    for batch in batches:
        if batch is None:
            continue  # nobody had data: the model stays as it was
        x, y = batch
        (md.loss(model(paddle.to_tensor(x)), paddle.to_tensor(y)) * len(y)).backward()
        if grads_only:
            return {k: p.grad.numpy().copy() for k, p in model.named_parameters()}
        with paddle.no_grad():
            for p in model.parameters():
                p.grad.scale_(1.0 / len(y))
        opt.step()
        opt.clear_grad()
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def _plain_torch(batches: list[tuple[np.ndarray, np.ndarray] | None], grads_only: bool = False) -> dict[str, np.ndarray]:
    import torch

    md = load_model_def(MODELS["torch"])
    torch.manual_seed(3)
    model = md.model()
    opt = md.optimizer(model.parameters(), 0.01)
    for batch in batches:
        if batch is None:
            continue
        x, y = batch
        md.loss(model(torch.as_tensor(x)), torch.as_tensor(y)).backward()  # the mean's gradients ...
        with torch.no_grad():
            for p in model.parameters():
                p.grad.mul_(len(y))  # ... times the rows: the summed per-sample gradients
        if grads_only:
            return {k: p.grad.numpy().copy() for k, p in model.named_parameters()}
        with torch.no_grad():
            for p in model.parameters():
                p.grad.mul_(1.0 / len(y))
        opt.step()
        opt.zero_grad()
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


PLAIN = {"paddle": _plain_paddle, "torch": _plain_torch}


def _replica(framework: str, **sizes):
    return load(framework).replica(load_model_def(MODELS[framework]), 3, 0.01, None, **sizes)


def _replica_steps(framework: str, batches: list[tuple[np.ndarray, np.ndarray] | None],
                   fail_after: int | None = None, overlap: bool = False):
    """Steps through ``all_reduce`` on this thread, or (``overlap``) as the trainer does: the buckets
    sent from backward's hooks to a ``Runner``'s thread, small buckets so that there are several."""
    sizes = {"bucket_bytes": 16384, "first_bytes": 1024} if overlap else {}
    r = _replica(framework, **sizes)
    r.warm_up(*_batches(1, rows=4)[0])  # leaves the framework's own gradients behind, as in the trainer
    group = load(framework).group("127.0.0.1", 0, 0, 1, 0, "gloo")  # world 1: the sum is the identity
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


def _assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)  # the same arithmetic


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlapped"])
def test_fused_steps_train_the_model_exactly_as_plain_steps(framework, overlap):
    batches = _batches(4)
    steps = [batches[0], batches[1], None, batches[2], batches[3]]
    r, summed = _replica_steps(framework, steps, overlap=overlap)
    _assert_same(r.parameters(), PLAIN[framework](steps))
    assert [int(s[4]) for s in summed] == [12, 12, 0, 12, 12]  # the slots come back exact


def test_gradients_are_the_summed_per_sample_gradients_after_the_all_reduce(framework):
    (x, y), = _batches(1)
    r = _replica(framework)
    r.backward(x, y)
    r.all_reduce(load(framework).group("127.0.0.1", 0, 0, 1, 0, "gloo"),
                 own_slots(1, 0, None, len(y), 0.0, False, False))
    names = [k for k, _ in r.model.named_parameters()]
    got = {k: np.array(p.grad.numpy()) for k, p in zip(names, r.params)}
    _assert_same(got, PLAIN[framework]([(x, y)], grads_only=True))


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlapped"])
def test_a_step_whose_all_reduce_failed_leaves_nothing_in_the_next_step(framework, overlap):
    batches = _batches(3)
    r, _ = _replica_steps(framework, [batches[0], batches[1], batches[2]], fail_after=1, overlap=overlap)
    _assert_same(r.parameters(), PLAIN[framework]([batches[0], batches[2]]))


def test_a_snapshot_restores_into_a_fresh_replica_that_then_steps_alike(framework):
    batches = _batches(3)
    r, _ = _replica_steps(framework, batches[:2])
    params, opt_arrays, extra = r.snapshot()
    assert opt_arrays, "the optimizer's state is in the snapshot"
    fresh = _replica(framework)
    fresh.restore(params, opt_arrays, extra)
    group = load(framework).group("127.0.0.1", 0, 0, 1, 0, "gloo")
    for rep in (r, fresh):
        rep.backward(*batches[2])
        rep.all_reduce(group, own_slots(1, 0, None, 12, 0.0, False, False))
        rep.end_step(12)
    _assert_same(fresh.parameters(), r.parameters())


def test_a_snapshot_of_another_model_does_not_restore(framework):
    r = _replica(framework)
    params, opt_arrays, extra = r.snapshot()
    with pytest.raises(ValueError, match="does not match"):
        r.restore({k: v[..., :1] for k, v in params.items()}, opt_arrays, extra)


def test_a_rebuilt_replica_still_exports(framework, tmp_path):
    """A trainer that loads a checkpoint rebuilds its replica: the export's sample input survives it."""
    r = _replica(framework)
    r.warm_up(*_batches(1, rows=4)[0])
    r.build()
    assert r.export(tmp_path) is None
    assert (tmp_path / "model.onnx").is_file()


def test_a_replica_seeds_numpy_for_the_models_build_and_leaves_the_process_stream_alone(framework):
    np.random.seed(1)
    untouched = np.random.random(3)
    np.random.seed(1)
    r = _replica(framework)
    np.testing.assert_array_equal(np.random.random(3), untouched)  # the process's stream is as it was
    np.random.seed(99)  # whatever the process drew from numpy: the same model from the same seed
    _assert_same(_replica(framework).parameters(), r.parameters())


def test_a_generation_aborted_during_backward_stops_pytorch_s_backward_and_leaves_nothing_behind(framework):
    batches = _batches(3)
    r = _replica(framework, bucket_bytes=16384, first_bytes=1024)
    r.warm_up(*_batches(1, rows=4)[0])
    group = load(framework).group("127.0.0.1", 0, 0, 1, 0, "gloo")
    runner = Runner()
    asked: list[int] = []

    def step(batch, abort=lambda: False) -> None:
        slots = own_slots(1, 0, None, len(batch[1]), 1.5, False, False)
        r.begin_step(group, len(slots), runner.submit, abort)
        r.backward(*batch)
        runner.wait(r.reduce_rest(group, slots, runner.submit), lambda: False)
        r.end_step(len(batch[1]))

    step(batches[0])
    if framework == "torch":  # its hooks' exceptions leave backward as themselves: it stops at the first gradient
        with pytest.raises(Abandoned):
            step(batches[1], lambda: asked.append(1) or True)
        assert len(asked) == 1
        r.drop_grads()  # as the trainer does, which then forms the next generation's group
        runner.abandon(group)
        group = load(framework).group("127.0.0.1", 0, 0, 1, 1, "gloo")
    else:  # Paddle's backward cannot be interrupted: the abort is not asked, the step completes
        step(batches[1], lambda: asked.append(1) or True)
        assert asked == []
    step(batches[2])
    want = [batches[0], batches[2]] if framework == "torch" else batches
    _assert_same(r.parameters(), PLAIN[framework](want))
