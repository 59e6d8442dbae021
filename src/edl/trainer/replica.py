"""This trainer's replica: the model and its optimizer, built, stepped, snapshotted and restored.

With the state codec (``edl.trainer.state``) and the export (``edl.trainer.export``), the
only part of the trainer that handles Paddle tensors.
"""

from __future__ import annotations

import numpy as np
import paddle
import pyarrow as pa

from edl.errors import UserError
from edl.modeldef import ModelDef
from edl.storage.store import ObjectStore
from edl.trainer import state
from edl.trainer.buckets import Bucket, plan_buckets
from edl.trainer.collective import Group
from edl.trainer.export import evaluate, export_model, read_warm_start


class Replica:
    def __init__(self, md: ModelDef, seed: int, learning_rate: float, init_model: str | None = None) -> None:
        self.md = md
        self.seed = seed
        self.learning_rate = learning_rate
        self.init_model = init_model
        self._init_params = read_warm_start(init_model) if init_model else None
        self.sample_input: np.ndarray | None = None  # one row of real input, for the export's input spec
        self.build()

    def build(self) -> None:
        """A fresh model and optimizer: seeded, or from ``--init-model``."""
        paddle.seed(self.seed)
        np.random.seed(self.seed)
        self.model = self.md.model()
        self.opt = self.md.optimizer(self.model.parameters(), self.learning_rate)
        if self._init_params is not None:
            try:
                state.set_parameters(self.model, self._init_params)
            except ValueError as e:
                raise UserError(f"--init-model {self.init_model!r}: the warm-start model does not match "
                                f"--model-def {self.md.name}: {e}") from None
        self.params = [p for p in self.model.parameters() if not p.stop_gradient]
        self.trained = False  # stepped or loaded since built
        self._flats: list[tuple[Bucket, paddle.Tensor]] = []  # the gradient buckets, built by all_reduce
        self._step_open = False  # a step's all-reduce began and its end_step has not run yet

    def warm_up(self, x: np.ndarray, y: np.ndarray) -> None:
        """One forward/backward on real rows, so that Paddle's first-call costs (kernel selection,
        allocations) are paid now; the gradients are dropped."""
        self.sample_input = x[:1]
        loss = self.md.loss(self.md.forward(self.model, paddle.to_tensor(x)), paddle.to_tensor(y))
        self.md.backward(loss)
        self.opt.clear_grad()

    def backward(self, x: np.ndarray, y: np.ndarray) -> float:
        """Accumulate the batch's *summed* per-sample gradients; answers its loss sum.
        What the user's code raises comes out as ``UserCodeError`` (``ModelDef``)."""
        self._drop_unfinished_step()
        loss = self.md.loss(self.md.forward(self.model, paddle.to_tensor(x)), paddle.to_tensor(y))
        count = len(y)
        loss_sum = float(loss) * count
        self.md.backward(loss * count)
        return loss_sum

    def all_reduce(self, group: Group, slots: np.ndarray) -> np.ndarray:
        """Sum every gradient in place, and the slots with them; answers the summed slots.

        Gradients live in a few flat buckets (``edl.trainer.buckets``), one all-reduce each;
        the slots ride at the end of the last one, so a rank that holds the summed slots of
        step s knows every gradient of s was summed too: "committed" and "every cursor
        known" coincide.
        """
        self._drop_unfinished_step()
        self._step_open = True
        flats = self._buckets(len(slots))
        summed = slots
        for b, flat in flats:
            self._pack(b, flat)
            if b.slots:
                flat[b.numel - b.slots :].copy_(paddle.to_tensor(slots, dtype=flat.dtype), False)
            group.all_reduce_sum(flat)
            if b.slots:
                summed = flat[b.numel - b.slots :].numpy()
        return summed

    def end_step(self, samples: int) -> None:
        """Apply the summed gradients of ``samples`` rows (none: the model stays as it was)."""
        if samples > 0:
            with paddle.no_grad():
                for _, flat in self._flats:
                    flat.scale_(1.0 / samples)  # summed per-sample gradients -> the mean
            self.opt.step()
            self.trained = True
        self._zero_grads()
        self._step_open = False

    # ------------------------------------------------------------ gradient buckets
    # Each gradient is made a view of its place in a bucket's flat buffer: backward then
    # accumulates straight into the buffer, and the all-reduce, the scaling and the zeroing
    # are one operation per bucket with no copies. Paddle's ``clear_grad`` would replace
    # the gradients with fresh tensors on the next backward (it marks them "fake empty"),
    # so between steps the buffers are zeroed instead. A gradient that Paddle did replace
    # (the first step, or after ``warm_up``) is copied into its place once and viewed again.
    def _buckets(self, slots: int) -> list[tuple[Bucket, paddle.Tensor]]:
        if self._flats and self._flats[-1][0].slots == slots:
            return self._flats
        plan = plan_buckets([(int(np.prod(p.shape)), _dtype_name(p.dtype)) for p in self.params], slots)
        by_name = {_dtype_name(p.dtype): p.dtype for p in self.params}
        self._flats = [(b, paddle.zeros([b.numel], by_name.get(b.dtype, paddle.float32))) for b in plan]
        return self._flats

    def _pack(self, b: Bucket, flat: paddle.Tensor) -> None:
        """Make every gradient of ``b`` a view of its place in ``flat``, copying those that are not."""
        base, item = flat.data_ptr(), flat.element_size()
        for i, n, at in zip(b.params, b.sizes, b.offsets):
            p = self.params[i]
            g = p._grad_ivar()
            if g is not None and g._is_initialized() and g.data_ptr() == base + at * item:
                continue  # already a view of its place: backward summed into the bucket
            place = flat[at : at + n]
            if g is None or not g._is_initialized():  # no data this step, or a parameter the batch did not touch
                place.zero_()
                p._set_grad_ivar(paddle.zeros(p.shape, p.dtype))
            else:
                place.copy_(g.reshape([n]), False)
            place.reshape(p.shape)._share_buffer_to(p._grad_ivar())

    def _zero_grads(self) -> None:
        if not self._flats:
            self.opt.clear_grad()
            return
        for _, flat in self._flats:
            flat.zero_()
        for p in self.params:  # any gradient outside the buckets (Paddle replaced it) is dropped
            g = p._grad_ivar()
            if g is not None and not any(g._is_shared_buffer_with(f) for _, f in self._flats):
                p.clear_gradient(False)

    def _drop_unfinished_step(self) -> None:
        """A step whose all-reduce failed (the generation ended) leaves partial sums behind: drop them."""
        if self._step_open:
            self._zero_grads()
            self._step_open = False

    def drop_grads(self) -> None:
        """Forget a failed step's gradients (partly summed). Their buffers, the buckets included, are
        released, not zeroed: a collective left behind on another thread may still write into them
        (it holds its own reference); the next step builds fresh buckets."""
        self._flats = []
        self._step_open = False
        self.opt.clear_grad(set_to_zero=False)

    def broadcast(self, group: Group, step: int) -> int:
        """Take rank 0's model, optimizer state and step (rank 0 sends its own)."""
        return state.broadcast_state(group, self.model, self.opt, step)

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
        """Copies of the parameters, the optimizer's arrays and its other state."""
        return state.snapshot(self.model, self.opt)

    def restore(self, params: dict[str, np.ndarray], opt_arrays: dict[str, np.ndarray], extra: dict) -> None:
        """Load a checkpoint's state; ``ValueError`` when it does not fit the model."""
        state.restore(self.model, self.opt, params, opt_arrays, extra)
        self.trained = True

    def export(self, store: ObjectStore) -> str:
        assert self.sample_input is not None, "warm_up() gives the export its input spec"
        return export_model(self.model, self.sample_input, store)

    def evaluate(self, table: pa.Table) -> dict[str, float]:
        return evaluate(self.md, self.model, table).metrics


def _dtype_name(dtype: paddle.dtype) -> str:
    return str(dtype).removeprefix("paddle.")
