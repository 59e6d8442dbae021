"""Model and optimizer state as named numpy arrays, and its broadcast to a generation.

Paddle names parameters with a process-global counter (``linear_3.w_0``), and
optimizer accumulators after them; two processes that built the same model in a
different order disagree. We translate to the structured names of
``named_parameters()`` (``net.0.weight``), which only depend on the model's code.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import paddle

from edl.api.framework import Group
from edl.frameworks import statecast


def _name_maps(model: paddle.nn.Layer) -> list[tuple[str, str]]:
    """(internal name, structured name), longest internal name first for prefix matching."""
    pairs = [(p.name, s) for s, p in model.named_parameters()]
    return sorted(pairs, key=lambda x: -len(x[0]))


def parameters(model: paddle.nn.Layer) -> dict[str, np.ndarray]:
    """A copy of the model's parameters by structured name."""
    return {s: p.numpy().copy() for s, p in model.named_parameters()}


def snapshot(model: paddle.nn.Layer, opt: paddle.optimizer.Optimizer) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
    """Copies of the parameters and the optimizer's arrays by structured name, and its other state."""
    tensors, extra = _state_tensors(model, opt)
    copies = {k: t.numpy().copy() for k, t in tensors.items()}
    return ({k[2:]: v for k, v in copies.items() if k.startswith("p:")},
            {k[2:]: v for k, v in copies.items() if k.startswith("o:")}, extra)


def set_parameters(model: paddle.nn.Layer, params: dict[str, np.ndarray]) -> None:
    """Set every parameter from ``params`` (by structured name); ``ValueError`` when they do not fit."""
    own = dict(model.named_parameters())
    missing = set(own) - set(params)
    if missing:
        raise ValueError(f"state does not match the model: missing {sorted(missing)[:3]}")
    for s, p in own.items():
        if tuple(p.shape) != tuple(params[s].shape):
            raise ValueError(f"state does not match the model: {s} has shape {tuple(params[s].shape)}, "
                             f"the model expects {tuple(p.shape)}")
        p.set_value(params[s])


def restore(model: paddle.nn.Layer, opt: paddle.optimizer.Optimizer, params: dict[str, np.ndarray],
            opt_arrays: dict[str, np.ndarray], extra: dict) -> None:
    set_parameters(model, params)
    internal = {s: p.name for s, p in model.named_parameters()}
    state: dict[str, Any] = dict(extra)
    for key, arr in opt_arrays.items():
        structured, _, suffix = key.partition("::")
        state[internal[structured] + suffix] = paddle.to_tensor(arr)
    if state:
        opt.set_state_dict(state)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("paddle.")


def _state_tensors(model: paddle.nn.Layer, opt: paddle.optimizer.Optimizer) -> tuple[dict[str, paddle.Tensor], dict]:
    """The live tensors of the model and its optimizer by structured name (``p:`` parameters, ``o:``
    optimizer state; no copies), and the optimizer's other state."""
    tensors: dict[str, paddle.Tensor] = {"p:" + s: p for s, p in model.named_parameters()}
    extra: dict[str, Any] = {}
    maps = _name_maps(model)
    for key, value in opt.state_dict().items():
        if isinstance(value, paddle.Tensor):
            for internal, structured in maps:
                if key.startswith(internal):
                    tensors["o:" + structured + "::" + key[len(internal):]] = value
                    break
        else:
            extra[key] = value
    return tensors, extra


class _Ops:
    """Paddle's tensors for ``edl.frameworks.statecast``."""

    def layout(self, t: paddle.Tensor) -> tuple[list[int], str, int]:
        return list(t.shape), _dtype_name(t.dtype), int(t.size) * t.element_size()

    def empty(self, shape: list[int], dtype: str) -> paddle.Tensor:
        return paddle.empty(shape, dtype)  # type: ignore[arg-type]  # Paddle's hints name the dtypes as literals

    def from_bytes(self, raw: bytes) -> paddle.Tensor:
        return paddle.to_tensor(np.frombuffer(raw, dtype=np.uint8))

    def to_bytes(self, t: paddle.Tensor) -> bytes:
        return t.numpy().tobytes()

    def cat(self, ts: list[paddle.Tensor]) -> paddle.Tensor:
        return paddle.concat([t.reshape([-1]) for t in ts])

    def unpack(self, flat: paddle.Tensor, targets: list[paddle.Tensor]) -> None:
        off = 0
        for t in targets:
            n = int(t.size)
            t.copy_(flat[off : off + n].reshape(t.shape), False)  # type: ignore[call-arg]  # (src, blocking)
            off += n

    def no_grad(self) -> AbstractContextManager:
        return paddle.no_grad()


def broadcast_state(group: Group, model: paddle.nn.Layer, opt: paddle.optimizer.Optimizer, step: int) -> int:
    """Rank 0 sends its model, optimizer state and step (``edl.frameworks.statecast``); every rank ends up
    identical. Returns rank 0's step. A receiver whose optimizer had no state yet loads what it received."""
    if group.world == 1:
        return step
    own, extra = _state_tensors(model, opt)
    got = statecast.broadcast(group, own, extra, step, _Ops())
    if group.rank != 0 and (got.fresh or got.extra != extra):
        internal = {s: p.name for s, p in model.named_parameters()}
        loaded: dict[str, Any] = dict(got.extra)
        for k, t in got.tensors.items():
            if k.startswith("o:"):
                structured, _, suffix = k[2:].partition("::")
                loaded[internal[structured] + suffix] = t
        opt.set_state_dict(loaded)
    return got.step
