"""This trainer's replica: the model and its optimizer, built, stepped, snapshotted and restored.

With the state codec (``edl.trainer.state``) and the export (``edl.trainer.export``), the
only part of the trainer that handles Paddle tensors.
"""

from __future__ import annotations

from concurrent.futures import Future
from functools import partial
from typing import Callable

import numpy as np
import paddle
import pyarrow as pa

from edl.errors import UserError
from edl.modeldef import ModelDef
from edl.storage.store import ObjectStore
from edl.trainer import state
from edl.trainer.buckets import BUCKET_BYTES, FIRST_BYTES, Bucket, plan_buckets
from edl.trainer.collective import Group
from edl.trainer.export import evaluate, export_model, read_warm_start

Submit = Callable[[Callable[[], object]], Future]  # queues a call on the collectives' thread (``Runner.submit``)


def _inline(fn: Callable[[], object]) -> Future:
    """A ``Submit`` that runs the call at once, on the caller's thread."""
    fut: Future = Future()
    try:
        fut.set_result(fn())
    except BaseException as e:  # noqa: BLE001 - the waiter re-raises it
        fut.set_exception(e)
    return fut


class Replica:
    def __init__(self, md: ModelDef, seed: int, learning_rate: float, init_model: str | None = None,
                 bucket_bytes: int = BUCKET_BYTES, first_bytes: int = FIRST_BYTES) -> None:
        self.md = md
        self.bucket_bytes, self.first_bytes = bucket_bytes, first_bytes  # the gradient buckets' sizes
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
        self._bucket_of: dict[int, int] = {}  # parameter index -> its bucket's
        self._step_open = False  # a step's all-reduce began and its end_step has not run yet
        # The step in progress (``begin_step`` to ``reduce_rest``): where buckets are summed, how many
        # gradients each still waits for, and the sums sent so far (always in the plan's order).
        self._sending: tuple[Group, Submit] | None = None
        self._left: list[int] = []
        self._sent: list[Future] = []
        for i, p in enumerate(self.params):
            p._register_backward_hook(partial(self._grad_ready, i))  # after its gradient is accumulated

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

    def begin_step(self, group: Group, slots: int, submit: Submit) -> None:
        """The next ``backward`` sums each bucket on ``submit``'s thread as soon as backward has made all
        its gradients, while it computes the earlier layers' (the slots' bucket waits for
        ``reduce_rest``). Buckets are sent in the plan's order on every rank, whatever order they
        complete in (one rank's unused parameter must not reorder its collectives)."""
        self._drop_unfinished_step()
        self._arm(group, slots, submit)

    def _arm(self, group: Group, slots: int, submit: Submit) -> None:
        flats = self._buckets(slots)
        self._sending = (group, submit)
        self._left = [len(b.params) for b, _ in flats]
        self._sent = []

    def _grad_ready(self, i: int) -> None:
        """Backward's hook: parameter ``i``'s gradient of this step is complete."""
        if self._sending is None:
            return  # not a training step's backward (the warm-up)
        self._left[self._bucket_of[i]] -= 1
        while len(self._sent) < len(self._flats) - 1 and self._left[len(self._sent)] == 0:
            self._send(len(self._sent))

    def _send(self, k: int) -> None:
        group, submit = self._sending  # type: ignore[misc]
        b, flat = self._flats[k]
        self._step_open = True
        self._pack(b, flat)
        self._sent.append(submit(partial(group.all_reduce_sum, flat)))

    def reduce_rest(self, group: Group, slots: np.ndarray, submit: Submit = _inline) -> Future:
        """Sum every gradient in place, and the slots with them; answers the future of the summed slots.

        Gradients live in a few flat buckets (``edl.trainer.buckets``), one all-reduce each; those
        that ``backward`` did not send (all of them without ``begin_step``) are sent now, and the
        slots ride at the end of the last one. A rank that holds the summed slots of step s knows
        every gradient of s was summed too: "committed" and "every cursor known" coincide. The
        future fails with the first bucket's failure.
        """
        if self._sending is None or self._sending[0] is not group:
            self._arm(group, len(slots), submit)
        self._step_open = True
        while len(self._sent) < len(self._flats) - 1:
            self._send(len(self._sent))
        b, flat = self._flats[-1]
        self._pack(b, flat)
        if b.slots:
            flat[b.numel - b.slots :].copy_(paddle.to_tensor(slots, dtype=flat.dtype), False)
        earlier = list(self._sent)
        self._sending = None

        def last() -> np.ndarray:
            for f in earlier:
                f.result()  # done (one thread, in order): raises the first bucket's failure
            group.all_reduce_sum(flat)
            return flat[b.numel - b.slots :].numpy() if b.slots else slots

        return submit(last)

    def all_reduce(self, group: Group, slots: np.ndarray) -> np.ndarray:
        """``reduce_rest`` on this thread: sum every gradient and the slots; answers the summed slots."""
        if self._sending is None:
            self._drop_unfinished_step()
        return self.reduce_rest(group, slots).result()  # type: ignore[no-any-return]

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
        # Backward makes the gradients from the last layer to the first: roughly the parameters' reverse.
        plan = plan_buckets([(int(np.prod(p.shape)), _dtype_name(p.dtype)) for p in self.params], slots,
                            self.bucket_bytes, self.first_bytes, ready=range(len(self.params) - 1, -1, -1))
        by_name = {_dtype_name(p.dtype): p.dtype for p in self.params}
        self._flats = [(b, paddle.zeros([b.numel], by_name.get(b.dtype, paddle.float32))) for b in plan]
        self._bucket_of = {i: k for k, (b, _) in enumerate(self._flats) for i in b.params}
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
        self._sending = None
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
