"""Which gradients share one all-reduce: a pure plan over the parameters' sizes and dtypes.

One collective per parameter pays the collective's fixed cost (a round of messages
between every pair of ranks) once per parameter; packing the gradients into a few
flat buffers pays it once per buffer. The buckets follow the order in which backward
produces the gradients (the model's last layer first), so that a bucket whose
gradients are all done is summed while backward computes the earlier layers'. As in
torch's DDP, a bucket is closed once it holds ``first_bytes`` (the first) or
``bucket_bytes`` (the others): closing only after a bucket has reached its size,
never before a parameter that would pass it, keeps a layer's weight with the bias
that backward produces together with it. Each bucket holds one dtype. The per-rank
slots (``edl.trainer.slots``) ride at the end of the last float32 bucket: float32
keeps them exact, and a rank holding the summed slots of a step then knows every
gradient of that step was summed too, in the same collective or an earlier one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FIRST_BYTES = 1 * 1024 * 1024  # the first bucket small, so that its sum starts early (as DDP)
BUCKET_BYTES = 4 * 1024 * 1024  # the others: a few collectives per model, each overlapping backward
SLOT_DTYPE = "float32"

_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4}


@dataclass(frozen=True)
class Bucket:
    """Parameters ``params`` (indices, in order), flattened one after the other, then ``slots`` values."""

    dtype: str
    params: tuple[int, ...]
    sizes: tuple[int, ...]  # each parameter's element count
    slots: int = 0  # the slot vector's length when it rides here, else 0

    @property
    def numel(self) -> int:
        return sum(self.sizes) + self.slots

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each parameter starts in the flat buffer; the slots start at ``sum(sizes)``."""
        out, at = [], 0
        for n in self.sizes:
            out.append(at)
            at += n
        return tuple(out)


def plan_buckets(params: Sequence[tuple[int, str]], slots: int, bucket_bytes: int = BUCKET_BYTES,
                 first_bytes: int | None = None, ready: Sequence[int] | None = None) -> tuple[Bucket, ...]:
    """Buckets for parameters given as ``(element count, dtype name)``, in the order they are all-reduced.

    ``ready`` is the order in which backward makes the gradients (indices into ``params``; the
    parameters' own order when not given); each bucket lists its parameters in that order. A
    bucket of a dtype is closed once it holds at least ``first_bytes`` (the first bucket of the
    plan; ``bucket_bytes`` when not given) or ``bucket_bytes`` (every later one). The slots go at
    the end of the last float32 bucket, or in a bucket of their own when there is none; that
    bucket is the last of the plan, so the slots are summed after every gradient.
    """
    first = bucket_bytes if first_bytes is None else first_bytes
    if bucket_bytes <= 0 or first <= 0:
        raise ValueError(f"bucket sizes must be positive, got {first} and {bucket_bytes}")
    order = list(range(len(params))) if ready is None else list(ready)
    if sorted(order) != list(range(len(params))):
        raise ValueError("ready must name every parameter once")
    open_: dict[str, tuple[list[int], list[int]]] = {}
    closed: list[Bucket] = []
    for i in order:
        n, dtype = params[i]
        idx, sizes = open_.setdefault(dtype, ([], []))
        idx.append(i)
        sizes.append(n)
        if sum(sizes) * _ITEMSIZE.get(dtype, 4) >= (bucket_bytes if closed else first):
            closed.append(Bucket(dtype, tuple(idx), tuple(sizes)))
            idx.clear()
            sizes.clear()
    last: list[Bucket] = []
    for dtype, (idx, sizes) in open_.items():
        if idx:
            (last if dtype == SLOT_DTYPE else closed).append(Bucket(dtype, tuple(idx), tuple(sizes)))
    if slots:
        if last:
            b = last[0]
            last = [Bucket(b.dtype, b.params, b.sizes, slots)]
        elif any(b.dtype == SLOT_DTYPE for b in closed):
            # The float32 gradients filled closed buckets exactly: the slots ride in the last of them.
            at = max(k for k, b in enumerate(closed) if b.dtype == SLOT_DTYPE)
            b = closed.pop(at)
            last = [Bucket(b.dtype, b.params, b.sizes, slots)]
        else:
            last = [Bucket(SLOT_DTYPE, (), (), slots)]
    return (*closed, *last)
