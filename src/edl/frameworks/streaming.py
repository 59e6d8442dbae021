"""A replica's gradient buckets, streamed to the all-reduce while backward runs: framework-neutral.

Each gradient is made a view of its place in a bucket's flat buffer (``edl.frameworks.buckets``
plans them), so backward accumulates straight into the buffers and the all-reduce, the scaling
and the zeroing are one operation per bucket with no copies. A hook per parameter, fired once its
gradient of the step is complete, counts the bucket down; a complete bucket is submitted to the
collectives' thread at once, in the plan's order on every rank. ``BucketedReplica`` holds that
bookkeeping; each framework's replica (``edl.frameworks.paddle.replica``,
``edl.frameworks.torch.replica``) supplies the tensor operations.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np

from edl.api.framework import Group, Snapshot, Submit
from edl.errors import Abandoned, UserError
from edl.frameworks.buckets import BUCKET_BYTES, FIRST_BYTES, Bucket, plan_buckets


def inline(fn: Callable[[], object]) -> Future:
    """A ``Submit`` that runs the call at once, on the caller's thread."""
    fut: Future = Future()
    try:
        fut.set_result(fn())
    except BaseException as e:  # noqa: BLE001 - the waiter re-raises it
        fut.set_exception(e)
    return fut


class BucketedReplica(ABC):
    """The model, its optimizer and the step's buckets. Subclasses build the model (``_build``) and
    implement the tensor operations below; ``self.params`` are the trainable parameters in the
    model's order, and a subclass calls ``self._grad_ready(i)`` when parameter ``i``'s gradient of a
    step is complete."""

    default_bucket_bytes = BUCKET_BYTES  # a bucket's size when the caller names none
    # Whether an exception raised in a gradient hook comes out of backward as itself (PyTorch's does; Paddle's
    # C++ turns it into a SystemError with the interpreter's error state set): only then does ``abort`` stop it.
    interruptible = False
    # The framework's state module: parameters, set_parameters, snapshot, restore, broadcast_state.
    state: ModuleType
    # The framework's export: (model, sample input, folder) -> why there is no ONNX model, or None.
    export_inference: Callable[[Any, Any, Path], str | None]
    sample_input: Any = None  # real rows of input, kept by warm_up for the export (kept across rebuilds)
    model: Any  # the framework's model and optimizer, made by ``_build``
    opt: Any

    def __init__(self, md: Any, seed: int, learning_rate: float, init_params: dict[str, np.ndarray] | None = None,
                 bucket_bytes: int | None = None, first_bytes: int | None = None) -> None:
        self.md = md
        self.bucket_bytes = self.default_bucket_bytes if bucket_bytes is None else bucket_bytes
        self.first_bytes = FIRST_BYTES if first_bytes is None else first_bytes
        self.seed = seed
        self.learning_rate = learning_rate
        self.init_params = init_params
        self.params: list[Any] = []
        self.build()

    # ------------------------------------------------------------ what a framework implements
    @abstractmethod
    def _build(self) -> None:
        """Seed the framework, build ``self.model`` and ``self.opt``, set ``self.params`` and register the
        hooks."""

    @abstractmethod
    def _param_layout(self) -> list[tuple[int, str]]:
        """(element count, dtype name) of each of ``self.params``."""

    @abstractmethod
    def _new_flat(self, numel: int, dtype: str) -> Any:
        """A zeroed one-dimensional buffer."""

    @abstractmethod
    def _pack(self, b: Bucket, flat: Any) -> None:
        """Make every gradient of ``b`` a view of its place in ``flat``, copying those that are not."""

    @abstractmethod
    def _put_slots(self, flat: Any, at: int, slots: np.ndarray) -> None: ...

    @abstractmethod
    def _get_slots(self, flat: Any, at: int) -> np.ndarray: ...

    @abstractmethod
    def _apply_mean(self, flats: list[Any], samples: int) -> None:
        """Scale the summed gradients by ``1 / samples`` and step the optimizer."""

    @abstractmethod
    def _zero_grads(self) -> None:
        """Zero the buckets (gradients outside them are dropped)."""

    @abstractmethod
    def _release_grads(self) -> None:
        """Drop every gradient without touching the buffers (a collective left behind may still write them)."""

    @abstractmethod
    def backward(self, x: Any, y: np.ndarray) -> float: ...

    # ------------------------------------------------------------ the step
    def build(self) -> None:
        """A fresh model and optimizer: seeded, or from the warm start."""
        # The user's model() and optimizer() may draw from numpy's global generator: it is seeded for them,
        # as the framework is, so that every trainer builds the same model; the process's own stream is
        # put back afterwards.
        saved = np.random.get_state()
        np.random.seed(self.seed % 2**32)
        try:
            self._build()
        finally:
            np.random.set_state(saved)
        if self.init_params is not None:
            try:
                self.set_parameters(self.init_params)
            except ValueError as e:
                raise UserError(f"--init-model: the warm-start model does not match --model-def {self.md.name}: "
                                f"{e}") from None
        self.trained = False
        self._flats: list[tuple[Bucket, Any]] = []  # the gradient buckets, built by the first step
        self._bucket_of: dict[int, int] = {}  # parameter index -> its bucket's
        self._step_open = False  # a step's all-reduce began and its end_step has not run yet
        # The step in progress (``begin_step`` to ``reduce_rest``): where buckets are summed, how many
        # gradients each still waits for, and the sums sent so far (always in the plan's order).
        self._sending: tuple[Group, Submit] | None = None
        self._abort: Callable[[], bool] | None = None
        self._left: list[int] = []
        self._sent: list[Future] = []

    def begin_step(self, group: Group, slots: int, submit: Submit, abort: Callable[[], bool] | None = None) -> None:
        """The next ``backward`` sums each bucket on ``submit``'s thread as soon as backward has made all
        its gradients, while it computes the earlier layers' (the slots' bucket waits for
        ``reduce_rest``). Buckets are sent in the plan's order on every rank, whatever order they
        complete in (one rank's unused parameter must not reorder its collectives). With ``abort``, an
        interruptible backward stops with ``Abandoned`` at the first gradient after it holds: a failed
        generation's step is redone elsewhere, and finishing it here only delays the next generation."""
        self._drop_unfinished_step()
        self._arm(group, slots, submit)
        self._abort = abort if self.interruptible else None

    def _arm(self, group: Group, slots: int, submit: Submit) -> None:
        flats = self._buckets(slots)
        self._sending = (group, submit)
        self._left = [len(b.params) for b, _ in flats]
        self._sent = []

    def _grad_ready(self, i: int) -> None:
        """Backward's hook: parameter ``i``'s gradient of this step is complete."""
        if self._sending is None:
            return  # not a training step's backward (the warm-up)
        if self._abort is not None and self._abort():
            raise Abandoned("the generation was aborted during backward")
        self._left[self._bucket_of[i]] -= 1
        while len(self._sent) < len(self._flats) - 1 and self._left[len(self._sent)] == 0:
            self._send(len(self._sent))

    def _send(self, k: int) -> None:
        group, submit = self._sending  # type: ignore[misc]
        b, flat = self._flats[k]
        self._step_open = True
        self._pack(b, flat)
        self._sent.append(submit(partial(group.all_reduce_sum, flat)))

    def reduce_rest(self, group: Group, slots: np.ndarray, submit: Submit = inline) -> Future:
        """Sum every gradient in place, and the slots with them; answers the future of the summed slots.

        Gradients live in a few flat buckets, one all-reduce each; those that ``backward`` did not send
        (all of them without ``begin_step``) are sent now, and the slots ride at the end of the last
        one. A rank that holds the summed slots of step s knows every gradient of s was summed too:
        "committed" and "every cursor known" coincide. The future fails with the first bucket's failure.
        """
        if self._sending is None or self._sending[0] is not group:
            self._arm(group, len(slots), submit)
        self._step_open = True
        while len(self._sent) < len(self._flats) - 1:
            self._send(len(self._sent))
        b, flat = self._flats[-1]
        self._pack(b, flat)
        at = b.numel - b.slots
        if b.slots:
            self._put_slots(flat, at, slots)
        earlier = list(self._sent)
        self._sending = None

        def last() -> np.ndarray:
            for f in earlier:
                f.result()  # done (one thread, in order): raises the first bucket's failure
            group.all_reduce_sum(flat)
            return self._get_slots(flat, at) if b.slots else slots

        return submit(last)

    def all_reduce(self, group: Group, slots: np.ndarray) -> np.ndarray:
        """``reduce_rest`` on this thread: sum every gradient and the slots; answers the summed slots."""
        if self._sending is None:
            self._drop_unfinished_step()
        return self.reduce_rest(group, slots).result()

    def end_step(self, samples: int) -> None:
        """Apply the summed gradients of ``samples`` rows (none: the model stays as it was)."""
        if samples > 0:
            self._apply_mean([flat for _, flat in self._flats], samples)
            self.trained = True
        self._zero_grads()
        self._step_open = False

    def _buckets(self, slots: int) -> list[tuple[Bucket, Any]]:
        if self._flats and self._flats[-1][0].slots == slots:
            return self._flats
        # Backward makes the gradients from the last layer to the first: roughly the parameters' reverse.
        plan = plan_buckets(self._param_layout(), slots, self.bucket_bytes, self.first_bytes,
                            ready=range(len(self.params) - 1, -1, -1))
        self._flats = [(b, self._new_flat(b.numel, b.dtype)) for b in plan]
        self._bucket_of = {i: k for k, (b, _) in enumerate(self._flats) for i in b.params}
        return self._flats

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
        self._abort = None
        self._release_grads()

    # ------------------------------------------------------------ state and the model out
    def set_parameters(self, params: dict[str, np.ndarray]) -> None:
        """Every parameter from ``params`` by structured name; ``ValueError`` when they do not fit."""
        self.state.set_parameters(self.model, params)

    def parameters(self) -> dict[str, np.ndarray]:
        return self.state.parameters(self.model)

    def broadcast(self, group: Group, step: int) -> int:
        """Take rank 0's model, optimizer state and step (rank 0 sends its own); answers the step."""
        return self.state.broadcast_state(group, self.model, self.opt, step)

    def snapshot(self) -> Snapshot:
        return self.state.snapshot(self.model, self.opt)

    def restore(self, params: dict[str, np.ndarray], opt_arrays: dict[str, np.ndarray], extra: dict) -> None:
        """Load a checkpoint's state; ``ValueError`` when it does not fit the model."""
        self.state.restore(self.model, self.opt, params, opt_arrays, extra)
        self.trained = True

    def export(self, out: Path) -> str | None:
        assert self.sample_input is not None, "warm_up() gives the export its sample input"
        return type(self).export_inference(self.model, self.sample_input, out)
