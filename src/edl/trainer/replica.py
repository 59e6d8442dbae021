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

    def warm_up(self, x: np.ndarray, y: np.ndarray) -> None:
        """One forward/backward on real rows, so that Paddle's first-call costs (kernel selection,
        allocations) are paid now; the gradients are dropped."""
        self.sample_input = x[:1]
        loss = self.md.loss(self.model(paddle.to_tensor(x)), paddle.to_tensor(y))
        loss.backward()
        self.opt.clear_grad()

    def backward(self, x: np.ndarray, y: np.ndarray) -> float:
        """Accumulate the batch's *summed* per-sample gradients; answers its loss sum."""
        loss = self.md.loss(self.model(paddle.to_tensor(x)), paddle.to_tensor(y))
        count = len(y)
        loss_sum = float(loss) * count
        (loss * count).backward()
        return loss_sum

    def all_reduce(self, group: Group, slots: np.ndarray) -> np.ndarray:
        """Sum every gradient in place, then the slots, and return the summed slots.

        The slots go last: a rank that holds the summed slots of step s knows every
        gradient of s was summed too, so "committed" and "every cursor known" coincide.
        """
        for p in self.params:
            if p.grad is None:  # no data this step, or a parameter the batch did not touch
                p._set_grad_ivar(paddle.zeros(p.shape, p.dtype))
            group.all_reduce_sum(p.grad)
        t = paddle.to_tensor(slots)
        group.all_reduce_sum(t)
        return t.numpy()

    def end_step(self, samples: int) -> None:
        """Apply the summed gradients of ``samples`` rows (none: the model stays as it was)."""
        if samples > 0:
            with paddle.no_grad():
                for p in self.params:
                    p.grad.scale_(1.0 / samples)  # summed per-sample gradients -> the mean
            self.opt.step()
            self.trained = True
        self.opt.clear_grad()

    def drop_grads(self) -> None:
        """Forget a failed step's gradients (partly summed). Their buffers are released, not zeroed:
        a collective left behind on another thread may still write into them."""
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
