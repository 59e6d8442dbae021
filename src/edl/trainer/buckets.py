"""Which gradients share one all-reduce: a pure plan over the parameters' sizes and dtypes.

One collective per parameter pays the collective's fixed cost (a round of messages
between every pair of ranks) once per parameter; packing the gradients into a few
flat buffers pays it once per buffer. Buffers are capped (25 MiB, as torch's DDP and
``paddle.DataParallel`` do) so that a large model never needs one huge copy, and hold
one dtype each. The per-rank slots (``edl.trainer.slots``) ride at the end of the
last float32 bucket: float32 keeps them exact, and a rank holding the summed slots of
a step then knows every gradient of that step was summed too, in the same collective
or an earlier one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CAP_BYTES = 25 * 1024 * 1024
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


def plan_buckets(params: Sequence[tuple[int, str]], slots: int, cap_bytes: int = CAP_BYTES) -> tuple[Bucket, ...]:
    """Buckets for parameters given as ``(element count, dtype name)``, in the order they are all-reduced.

    Parameters keep their relative order within a dtype; a bucket is closed once adding the next
    parameter would pass ``cap_bytes`` (a parameter larger than the cap gets a bucket of its own).
    The slots go at the end of the last float32 bucket, or in a bucket of their own when there is
    none; that bucket is the last of the plan, so the slots are summed after every gradient.
    """
    if cap_bytes <= 0:
        raise ValueError(f"cap_bytes must be positive, got {cap_bytes}")
    open_: dict[str, tuple[list[int], list[int]]] = {}
    closed: list[Bucket] = []
    for i, (n, dtype) in enumerate(params):
        item = _ITEMSIZE.get(dtype, 4)
        idx, sizes = open_.setdefault(dtype, ([], []))
        if idx and (sum(sizes) + n) * item > cap_bytes:
            closed.append(Bucket(dtype, tuple(idx), tuple(sizes)))
            idx.clear()
            sizes.clear()
        idx.append(i)
        sizes.append(n)
    last: list[Bucket] = []
    for dtype, (idx, sizes) in open_.items():
        if idx:
            (last if dtype == SLOT_DTYPE else closed).append(Bucket(dtype, tuple(idx), tuple(sizes)))
    if slots:
        if last:
            b = last[0]
            last = [Bucket(b.dtype, b.params, b.sizes, slots)]
        else:
            last = [Bucket(SLOT_DTYPE, (), (), slots)]
    return (*closed, *last)
