"""A PyTorch model's and optimizer's state as named numpy arrays, and its broadcast to a generation.

Parameters and persistent buffers go by their ``state_dict`` names (``net.0.weight``). The
optimizer's per-parameter state goes by the parameter's name and the state's key
(``net.0.weight::exp_avg``); its param groups (learning rate, betas, ...) and any scalar state
travel as JSON, the parameters of each group as names rather than ``state_dict``'s positions.
"""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch

from edl.api.framework import Group, Snapshot
from edl.frameworks import statecast

def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def parameters(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """Copies of the parameters and persistent buffers by name."""
    return {k: _numpy(v) for k, v in model.state_dict().items()}


def set_parameters(model: torch.nn.Module, params: dict[str, np.ndarray]) -> None:
    """Every parameter and persistent buffer from ``params``; ``ValueError`` when they do not fit."""
    own = model.state_dict()
    missing = set(own) - set(params)
    if missing:
        raise ValueError(f"state does not match the model: missing {sorted(missing)[:3]}")
    with torch.no_grad():
        for k, t in own.items():
            if tuple(t.shape) != tuple(params[k].shape):
                raise ValueError(f"state does not match the model: {k} has shape {tuple(params[k].shape)}, "
                                 f"the model expects {tuple(t.shape)}")
            t.copy_(torch.from_numpy(np.asarray(params[k])))


def _param_names(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[str]:
    """The name of each parameter in the optimizer's order (``state_dict``'s positions)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in opt.param_groups for p in g["params"]]


def _state_tensors(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """The live tensors of the model (``p:``) and its optimizer's state (``o:NAME::KEY``; no copies),
    and the rest of the optimizer's state as JSON."""
    tensors: dict[str, torch.Tensor] = {"p:" + k: v for k, v in model.state_dict().items()}
    names = _param_names(model, opt)
    sd = opt.state_dict()
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for key, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"o:{names[idx]}::{key}"] = v
            else:
                scalars.setdefault(names[idx], {})[key] = v
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[i] for i in g["params"]]}
              for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Snapshot:
    tensors, extra = _state_tensors(model, opt)
    return ({k[2:]: _numpy(t) for k, t in tensors.items() if k.startswith("p:")},
            {k[2:]: _numpy(t) for k, t in tensors.items() if k.startswith("o:")}, json.loads(json.dumps(extra)))


def _load_optimizer(model: torch.nn.Module, opt: torch.optim.Optimizer, arrays: dict[str, torch.Tensor],
                    extra: dict) -> None:
    names = _param_names(model, opt)
    index = {n: i for i, n in enumerate(names)}
    state: dict[int, dict[str, Any]] = {}
    for key, t in arrays.items():
        name, _, what = key.partition("::")
        if name not in index:
            raise ValueError(f"optimizer state names {name!r}, which the model does not have")
        state.setdefault(index[name], {})[what] = t
    for name, values in extra.get("scalars", {}).items():
        state.setdefault(index[name], {}).update(values)
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in extra.get("param_groups", [])]
    if not groups:
        return
    opt.load_state_dict({"state": state, "param_groups": groups})


def restore(model: torch.nn.Module, opt: torch.optim.Optimizer, params: dict[str, np.ndarray],
            opt_arrays: dict[str, np.ndarray], extra: dict) -> None:
    set_parameters(model, params)
    try:
        _load_optimizer(model, opt, {k: torch.from_numpy(np.array(v)) for k, v in opt_arrays.items()}, extra)
    except (KeyError, ValueError) as e:  # torch's own check of the groups' sizes raises ValueError
        raise ValueError(f"optimizer state does not match: {e}") from None


class _Ops:
    """PyTorch's tensors for ``edl.frameworks.statecast``."""

    def layout(self, t: torch.Tensor) -> tuple[list[int], str, int]:
        return list(t.shape), _dtype_name(t.dtype), t.numel() * t.element_size()

    def empty(self, shape: list[int], dtype: str) -> torch.Tensor:
        return torch.empty(shape, dtype=getattr(torch, dtype))

    def from_bytes(self, raw: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)

    def to_bytes(self, t: torch.Tensor) -> bytes:
        return t.numpy().tobytes()

    def cat(self, ts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for t in ts])

    def unpack(self, flat: torch.Tensor, targets: list[torch.Tensor]) -> None:
        off = 0
        for t in targets:
            n = t.numel()
            t.copy_(flat[off : off + n].reshape(t.shape))
            off += n

    def no_grad(self) -> AbstractContextManager:
        return torch.no_grad()


def broadcast_state(group: Group, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> int:
    """Rank 0 sends its model, optimizer state and step (``edl.frameworks.statecast``); every rank ends up
    identical. Returns rank 0's step. A receiver whose optimizer had no state yet loads what it received."""
    if group.world == 1:
        return step
    own, extra = _state_tensors(model, opt)
    extra = json.loads(json.dumps(extra))  # as it travels (tuples become lists)
    got = statecast.broadcast(group, own, extra, step, _Ops())
    if group.rank != 0 and (got.fresh or got.extra != extra):
        _load_optimizer(model, opt, {k[2:]: t for k, t in got.tensors.items() if k.startswith("o:")}, got.extra)
    return got.step
