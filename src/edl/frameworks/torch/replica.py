"""A PyTorch replica: the model and its optimizer, built, stepped, snapshotted and restored."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from edl.frameworks import check_one_framework
from edl.frameworks.buckets import Bucket
from edl.frameworks.streaming import BucketedReplica
from edl.frameworks.torch import state
from edl.frameworks.torch.export import export_inference, tensor_of, tensors_of


class TorchReplica(BucketedReplica):
    # DDP's own default (``bucket_cap_mb=25``; the first bucket 1 MB as DDP's, edl.frameworks.buckets):
    # on CPUs, fewer and larger all-reduces leave backward more of the core (bench/throughput.py).
    default_bucket_bytes = 25 * 1024 * 1024
    interruptible = True  # a hook's exception leaves backward as itself
    _count = 0  # the rows of the step's batch
    state = state
    export_inference = staticmethod(export_inference)

    def _build(self) -> None:
        torch.manual_seed(self.seed)
        self.model = self.md.model()
        self.opt = self.md.optimizer(self.model.parameters(), self.learning_rate)
        check_one_framework(self.md, "torch", "optimizer()", self.opt)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        for i, p in enumerate(self.params):
            # After the step's gradient is accumulated into ``p.grad`` (a view of its bucket).
            p.register_post_accumulate_grad_hook(lambda _p, i=i: self._grad_ready(i))

    def warm_up(self, x: Any, y: np.ndarray) -> None:
        """One forward/backward on real rows (allocations, the autograd graph's first build); the
        gradients are dropped."""
        self.sample_input = x[:2] if not isinstance(x, tuple) else tuple(a[:2] for a in x)
        loss = self.md.loss(self.md.forward(self.model, *tensors_of(x)), tensor_of(y))
        self.md.backward(loss)
        self.opt.zero_grad(set_to_none=True)

    def backward(self, x: Any, y: np.ndarray) -> float:
        """Accumulate the batch's *summed* per-sample gradients; answers its loss sum.
        What the user's code raises comes out as ``UserCodeError`` (``ModelDef``)."""
        self._drop_unfinished_step()
        loss = self.md.loss(self.md.forward(self.model, *tensors_of(x)), tensor_of(y))
        self._count = len(y)  # the mean's gradients times the rows: the sums, made as each is packed
        self.md.backward(loss)
        return float(loss.detach()) * self._count

    # ------------------------------------------------------------ gradient buckets
    # Between steps every ``p.grad`` is None, so backward hands over each gradient as the tensor it
    # computed (no accumulation into a zeroed buffer, as DDP's own gradients): the bucket's send copies
    # it into its place and makes ``p.grad`` a view of it, which the all-reduce, the scaling and the
    # optimizer then use in place; the copy also multiplies the batch's mean gradient by its rows
    # (the all-reduce sums per-sample sums). Zeroing the buckets, accumulating into them and scaling
    # the loss instead cost three more passes over every gradient a step.
    def _param_layout(self) -> list[tuple[int, str]]:
        return [(p.numel(), str(p.dtype).removeprefix("torch.")) for p in self.params]

    def _new_flat(self, numel: int, dtype: str) -> torch.Tensor:
        device = self.params[0].device if self.params else torch.device("cpu")
        return torch.zeros(numel, dtype=getattr(torch, dtype), device=device)

    def _pack(self, b: Bucket, flat: torch.Tensor) -> None:
        for i, n, at in zip(b.params, b.sizes, b.offsets):
            p = self.params[i]
            place = flat[at : at + n].view_as(p)
            g = p.grad
            if g is not None and g.data_ptr() == place.data_ptr():
                continue  # already a view of its place: backward summed into the bucket
            if g is None:  # no data this step, or a parameter the batch did not touch
                place.zero_()
            else:
                torch.mul(g, self._count, out=place)  # copied and made a sum in one pass
            p.grad = place

    def _put_slots(self, flat: torch.Tensor, at: int, slots: np.ndarray) -> None:
        flat[at:].copy_(torch.from_numpy(np.ascontiguousarray(slots, dtype=np.float32)))

    def _get_slots(self, flat: torch.Tensor, at: int) -> np.ndarray:
        return flat[at:].cpu().numpy().copy()

    def _apply_mean(self, flats: list[torch.Tensor], samples: int) -> None:
        with torch.no_grad():
            for flat in flats:
                flat.mul_(1.0 / samples)  # summed per-sample gradients -> the mean
        self.opt.step()

    def _zero_grads(self) -> None:
        for p in self.params:  # the buckets keep their (stale) values: each send overwrites its own
            p.grad = None

    def _release_grads(self) -> None:
        for p in self.params:
            p.grad = None

    # ------------------------------------------------------------ the model out
    def evaluate(self, x: Any, y: np.ndarray, batch: int = 1024) -> tuple[float, np.ndarray]:
        self.model.eval()
        parts = x if isinstance(x, tuple) else (x,)
        try:
            with torch.no_grad():
                out = torch.cat([self.md.forward(self.model, *tensors_of(tuple(a[i : i + batch] for a in parts)))
                                 for i in range(0, len(y), batch)])
                loss = float(self.md.loss(out, tensor_of(y)))
        finally:
            self.model.train()
        return loss, out.cpu().numpy()
