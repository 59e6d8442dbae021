"""Rank 0's model and optimizer state to every rank of a generation, framework-neutral.

The layout (names, shapes, dtypes), the step and the optimizer's other state travel as JSON.
Tensors travel in place: each large one is broadcast straight from rank 0's own tensor into
the receiver's (no copies on either side); the small ones are packed, one buffer per dtype. A
receiver that lacks a tensor of the optimizer's state (a joiner whose optimizer never stepped)
receives it into a fresh one, and its framework loads those. Each framework gives the few
tensor operations this needs (``TensorOps``).
"""

from __future__ import annotations

import json
import math
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from edl.api.framework import Group

SMALL_BYTES = 256 * 1024  # tensors below this travel packed together, one broadcast per dtype


class TensorOps(Protocol):
    def layout(self, t: Any) -> tuple[list[int], str, int]:
        """Shape, dtype name and size in bytes."""

    def empty(self, shape: list[int], dtype: str) -> Any: ...

    def from_bytes(self, raw: bytes) -> Any:
        """A one-dimensional uint8 tensor of ``raw``."""

    def to_bytes(self, t: Any) -> bytes: ...

    def cat(self, ts: list[Any]) -> Any:
        """The tensors flattened, one after the other."""

    def unpack(self, flat: Any, targets: list[Any]) -> None:
        """Copy consecutive pieces of ``flat`` into ``targets``, in place."""

    def no_grad(self) -> AbstractContextManager: ...


@dataclass(frozen=True)
class Received:
    step: int  # rank 0's
    tensors: dict[str, Any]  # every tensor of the layout, now rank 0's values (own ones in place)
    fresh: bool  # some were made here (this rank lacked them)
    extra: dict  # rank 0's optimizer state besides tensors


def _broadcast_json(group: Group, obj: dict | None, ops: TensorOps) -> dict:
    """Rank 0's JSON to every rank (length first, then bytes)."""
    raw = json.dumps(obj).encode() if group.rank == 0 else b""
    size = ops.from_bytes(len(raw).to_bytes(8, "little"))
    group.broadcast(size, 0)
    buf = ops.from_bytes(raw if group.rank == 0 else bytes(int.from_bytes(ops.to_bytes(size), "little")))
    group.broadcast(buf, 0)
    return obj if group.rank == 0 else json.loads(ops.to_bytes(buf))  # type: ignore[return-value]


def broadcast(group: Group, own: dict[str, Any], extra: dict, step: int, ops: TensorOps) -> Received:
    """Rank 0's ``own`` tensors (``p:`` parameters, ``o:`` optimizer state), ``extra`` and ``step`` to every
    rank; ``ValueError`` when a parameter does not match rank 0's."""
    if group.rank == 0:
        meta = _broadcast_json(group, {"step": step, "opt_extra": extra,
                                       "layout": [[k, *ops.layout(t)[:2]] for k, t in own.items()]}, ops)
    else:
        meta = _broadcast_json(group, None, ops)
    targets: dict[str, Any] = {}
    fresh = False
    for k, shape, dt in meta["layout"]:
        t = own.get(k)
        if t is None or ops.layout(t)[:2] != (shape, dt):
            if k.startswith("p:"):
                raise ValueError(f"state does not match the model: {k[2:]} is {shape} {dt} on rank 0")
            t = ops.empty(shape, dt)
            fresh = True
        targets[k] = t
    small: dict[str, list[str]] = {}
    with ops.no_grad():
        for k, _, dt in meta["layout"]:
            if ops.layout(targets[k])[2] >= SMALL_BYTES:
                group.broadcast(targets[k], 0)
            else:
                small.setdefault(dt, []).append(k)
        for dt, keys in sorted(small.items()):
            pieces = [targets[k] for k in keys]
            if group.rank == 0:
                group.broadcast(ops.cat(pieces), 0)
            else:
                flat = ops.empty([sum(math.prod(ops.layout(t)[0]) for t in pieces)], dt)
                group.broadcast(flat, 0)
                ops.unpack(flat, pieces)
    return Received(int(meta["step"]), targets, fresh, meta["opt_extra"])
