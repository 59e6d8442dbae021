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

from edl.trainer.collective import Group


def _name_maps(model: paddle.nn.Layer) -> list[tuple[str, str]]:
    """(internal name, structured name), longest internal name first for prefix matching."""
    pairs = [(p.name, s) for s, p in model.named_parameters()]
    return sorted(pairs, key=lambda x: -len(x[0]))


def parameters(model: paddle.nn.Layer) -> dict[str, np.ndarray]:
    """A copy of the model's parameters by structured name."""
    return {s: p.numpy().copy() for s, p in model.named_parameters()}


def snapshot(model: paddle.nn.Layer, opt: paddle.optimizer.Optimizer) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
    params = parameters(model)
    opt_arrays: dict[str, np.ndarray] = {}
    extra: dict[str, Any] = {}
    maps = _name_maps(model)
    for key, value in opt.state_dict().items():
        if isinstance(value, paddle.Tensor):
            for internal, structured in maps:
                if key.startswith(internal):
                    opt_arrays[structured + "::" + key[len(internal):]] = value.numpy().copy()
                    break
        else:
            extra[key] = value
    return params, opt_arrays, extra


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


def broadcast_state(group: Group, model: paddle.nn.Layer, opt: paddle.optimizer.Optimizer, step: int) -> int:
    """Rank 0 sends its model, optimizer state and step; every rank ends up identical.

    Layout and scalars travel as JSON, tensors as one flat buffer per dtype, all
    through the collective. Returns rank 0's step.
    """
    if group.world == 1:
        return step
    if group.rank == 0:
        params, opt_arrays, extra = snapshot(model, opt)
        arrays = {"p:" + k: v for k, v in params.items()} | {"o:" + k: v for k, v in opt_arrays.items()}
        meta = {
            "step": step,
            "layout": [[k, list(v.shape), str(v.dtype)] for k, v in arrays.items()],
            "opt_extra": extra,
        }
        _broadcast_json(group, meta)
    else:
        meta = _broadcast_json(group, None)
        arrays = {k: np.zeros(shape, dtype=dt) for k, shape, dt in meta["layout"]}
    by_dtype: dict[str, list[str]] = {}
    for k, _, dt in meta["layout"]:
        by_dtype.setdefault(dt, []).append(k)
    for dt, keys in sorted(by_dtype.items()):
        flat = np.concatenate([arrays[k].ravel() for k in keys]) if keys else np.zeros(0, dtype=dt)
        t = paddle.to_tensor(flat)
        group.broadcast(t, 0)
        if group.rank != 0:
            out = t.numpy()
            off = 0
            for k in keys:
                n = arrays[k].size
                arrays[k] = out[off : off + n].reshape(arrays[k].shape)
                off += n
    if group.rank != 0:
        params = {k[2:]: v for k, v in arrays.items() if k.startswith("p:")}
        opt_arrays = {k[2:]: v for k, v in arrays.items() if k.startswith("o:")}
        restore(model, opt, params, opt_arrays, meta["opt_extra"])
    return int(meta["step"])

