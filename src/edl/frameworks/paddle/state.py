"""Model and optimizer state as named numpy arrays, and its broadcast to a generation.

Paddle names parameters with a process-global counter (``linear_3.w_0``), and
optimizer accumulators after them; two processes that built the same model in a
different order disagree. We translate to the structured names of
``named_parameters()`` (``net.0.weight``), which only depend on the model's code.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import paddle

from edl.api.framework import Group


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


def _broadcast_json(group: Group, obj: dict | None) -> dict:
    """Rank 0's JSON to every rank, through the collective (length first, then bytes)."""
    raw = json.dumps(obj).encode() if group.rank == 0 else b""
    size = paddle.to_tensor(np.array([len(raw)], dtype=np.int64))
    group.broadcast(size, 0)
    n = int(size.numpy()[0])
    buf = paddle.to_tensor(np.frombuffer(raw, dtype=np.uint8) if group.rank == 0 else np.zeros(n, dtype=np.uint8))
    group.broadcast(buf, 0)
    return obj if group.rank == 0 else json.loads(buf.numpy().tobytes())


SMALL_BYTES = 256 * 1024  # tensors below this travel packed together, one broadcast per dtype


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


def broadcast_state(group: Group, model: paddle.nn.Layer, opt: paddle.optimizer.Optimizer, step: int) -> int:
    """Rank 0 sends its model, optimizer state and step; every rank ends up identical. Returns rank 0's step.

    The layout and the scalars travel as JSON. Tensors travel in place: each large one is broadcast
    straight from rank 0's own tensor into the receiver's (no copies on either side); the small ones
    are packed, one buffer per dtype. A receiver whose optimizer has not made its state yet (a
    joiner that never stepped) receives that part into fresh tensors and loads them.
    """
    if group.world == 1:
        return step
    own, extra = _state_tensors(model, opt)
    if group.rank == 0:
        meta = _broadcast_json(group, {
            "step": step,
            "layout": [[k, list(t.shape), _dtype_name(t.dtype)] for k, t in own.items()],
            "opt_extra": extra,
        })
    else:
        meta = _broadcast_json(group, None)
    targets: dict[str, paddle.Tensor] = {}
    fresh: list[str] = []  # optimizer state this rank did not have yet
    for k, shape, dt in meta["layout"]:
        t = own.get(k)
        if t is None or list(t.shape) != shape or _dtype_name(t.dtype) != dt:
            if k.startswith("p:"):
                raise ValueError(f"state does not match the model: {k[2:]} is {shape} {dt} on rank 0")
            t = paddle.empty(shape, dt)
            fresh.append(k)
        targets[k] = t
    small: dict[str, list[str]] = {}
    with paddle.no_grad():
        for k, shape, dt in meta["layout"]:
            t = targets[k]
            if int(t.size) * t.element_size() >= SMALL_BYTES:
                group.broadcast(t, 0)
            else:
                small.setdefault(dt, []).append(k)
        for dt, keys in sorted(small.items()):
            flat = (paddle.concat([targets[k].reshape([-1]) for k in keys]) if group.rank == 0
                    else paddle.empty([sum(int(targets[k].size) for k in keys)], dt))
            group.broadcast(flat, 0)
            if group.rank != 0:
                off = 0
                for k in keys:
                    n = int(targets[k].size)
                    targets[k].copy_(flat[off : off + n].reshape(targets[k].shape), False)
                    off += n
    if group.rank != 0 and (fresh or meta["opt_extra"] != extra):
        internal = {s: p.name for s, p in model.named_parameters()}
        loaded: dict[str, Any] = dict(meta["opt_extra"])
        for k, t in targets.items():
            if k.startswith("o:"):
                structured, _, suffix = k[2:].partition("::")
                loaded[internal[structured] + suffix] = t
        opt.set_state_dict(loaded)
    return int(meta["step"])
