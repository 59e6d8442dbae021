"""A PaddlePaddle replica: the model and its optimizer, built, stepped, snapshotted and restored."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import paddle

from edl.frameworks import check_one_framework
from edl.frameworks.buckets import Bucket
from edl.frameworks.paddle import state
from edl.frameworks.paddle.export import export_inference
from edl.frameworks.streaming import BucketedReplica


def _dtype_name(dtype: paddle.dtype) -> str:
    return str(dtype).removeprefix("paddle.")


def _tensors(x: Any) -> tuple[paddle.Tensor, ...]:
    """The model's inputs: ``collate`` may give one array or a tuple of them."""
    return tuple(paddle.to_tensor(a) for a in x) if isinstance(x, tuple) else (paddle.to_tensor(x),)


class PaddleReplica(BucketedReplica):
    state = state
    export_inference = staticmethod(export_inference)

    def _build(self) -> None:
        paddle.seed(self.seed)
        self.model = self.md.model()
        self.opt = self.md.optimizer(self.model.parameters(), self.learning_rate)
        check_one_framework(self.md, "paddle", "optimizer()", self.opt)
        self.params = [p for p in self.model.parameters() if not p.stop_gradient]
        for i, p in enumerate(self.params):
            p._register_backward_hook(partial(self._grad_ready, i))  # after its gradient is accumulated

    def warm_up(self, x: Any, y: np.ndarray) -> None:
        """One forward/backward on real rows, so that Paddle's first-call costs (kernel selection,
        allocations) are paid now; the gradients are dropped."""
        self.sample_input = x[:1] if not isinstance(x, tuple) else tuple(a[:1] for a in x)
        loss = self.md.loss(self.md.forward(self.model, *_tensors(x)), paddle.to_tensor(y))
        self.md.backward(loss)
        self.opt.clear_grad()

    def backward(self, x: Any, y: np.ndarray) -> float:
        """Accumulate the batch's *summed* per-sample gradients; answers its loss sum.
        What the user's code raises comes out as ``UserCodeError`` (``ModelDef``)."""
        self._drop_unfinished_step()
        loss = self.md.loss(self.md.forward(self.model, *_tensors(x)), paddle.to_tensor(y))
        count = len(y)
        loss_sum = float(loss) * count
        self.md.backward(loss * count)
        return loss_sum

    # ------------------------------------------------------------ gradient buckets
    # Paddle's ``clear_grad`` would replace the gradients with fresh tensors on the next backward
    # (it marks them "fake empty"), so between steps the buffers are zeroed instead. A gradient
    # that Paddle did replace (the first step, or after ``warm_up``) is copied into its place once
    # and viewed again.
    def _param_layout(self) -> list[tuple[int, str]]:
        return [(int(np.prod(p.shape)), _dtype_name(p.dtype)) for p in self.params]

    def _new_flat(self, numel: int, dtype: str) -> paddle.Tensor:
        by_name = {_dtype_name(p.dtype): p.dtype for p in self.params}
        return paddle.zeros([numel], by_name.get(dtype, paddle.float32))

    def _pack(self, b: Bucket, flat: paddle.Tensor) -> None:
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
                place.copy_(g.reshape([n]), False)  # type: ignore[call-arg]  # Paddle's hints lack blocking
            place.reshape(p.shape)._share_buffer_to(p._grad_ivar())

    def _put_slots(self, flat: paddle.Tensor, at: int, slots: np.ndarray) -> None:
        flat[at:].copy_(paddle.to_tensor(slots, dtype=flat.dtype), False)  # type: ignore[call-arg]

    def _get_slots(self, flat: paddle.Tensor, at: int) -> np.ndarray:
        return flat[at:].numpy()

    def _apply_mean(self, flats: list[paddle.Tensor], samples: int) -> None:
        with paddle.no_grad():
            for flat in flats:
                flat.scale_(1.0 / samples)  # summed per-sample gradients -> the mean
        self.opt.step()

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

    def _release_grads(self) -> None:
        self.opt.clear_grad(set_to_zero=False)

    # ------------------------------------------------------------ the model out
    def evaluate(self, x: Any, y: np.ndarray, batch: int = 1024) -> tuple[float, np.ndarray]:
        self.model.eval()
        try:
            with paddle.no_grad():
                parts = x if isinstance(x, tuple) else (x,)
                out = paddle.concat([self.md.forward(self.model, *_tensors(tuple(a[i : i + batch] for a in parts)))
                                     for i in range(0, len(y), batch)])
                loss = float(self.md.loss(out, paddle.to_tensor(y)))
        finally:
            self.model.train()
        return loss, out.numpy()
