"""A served model's tensors and whether a request fits them: pure, in the Open Inference Protocol's terms.

The protocol (KServe v2) names each tensor and gives its datatype (``FP32``, ``INT64``, ...)
and shape; a dimension the model leaves open (the batch) is ``-1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

# ONNX Runtime's element types (``NodeArg.type``) in the protocol's names.
ORT_DATATYPES = {
    "tensor(float)": "FP32", "tensor(double)": "FP64", "tensor(float16)": "FP16",
    "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL", "tensor(string)": "BYTES",
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # the protocol's: FP32, INT64, ...
    shape: tuple[int, ...]  # -1 where any size goes

    @classmethod
    def of_onnx(cls, name: str, ort_type: str, ort_shape: Sequence[object]) -> "TensorSpec":
        """From ONNX Runtime's ``NodeArg``: a symbolic or unknown dimension becomes -1."""
        return cls(name, ORT_DATATYPES.get(ort_type, ort_type),
                   tuple(d if isinstance(d, int) and d >= 0 else -1 for d in ort_shape))

    def to_json(self) -> dict:
        """The protocol's tensor metadata (``GET /v2/models/{name}``)."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def describe(self) -> str:
        return f"{self.name!r} ({self.datatype}, shape {list(self.shape)})"


@dataclass(frozen=True)
class RequestTensor:
    """What a request says of one of its input tensors."""

    name: str
    datatype: str
    shape: tuple[int, ...]


def request_problem(model_inputs: Sequence[TensorSpec], given: Sequence[RequestTensor]) -> str | None:
    """Why the request's inputs do not fit the model's, in one line; None when they do."""
    by_name = {t.name: t for t in given}
    if len(by_name) != len(given):
        return "a request names an input twice"
    unknown = sorted(set(by_name) - {s.name for s in model_inputs})
    if unknown:
        expected = ", ".join(s.describe() for s in model_inputs)
        return f"input {unknown[0]!r} is not the model's; it takes {expected}"
    for spec in model_inputs:
        t = by_name.get(spec.name)
        if t is None:
            return f"input {spec.describe()} is missing"
        if t.datatype.upper() != spec.datatype:
            return f"input {spec.name!r}: datatype {t.datatype}, the model takes {spec.datatype}"
        if len(t.shape) != len(spec.shape) or any(want not in (-1, got) for want, got in zip(spec.shape, t.shape)):
            return f"input {spec.name!r}: shape {list(t.shape)}, the model takes {list(spec.shape)} (-1: any size)"
        if any(d < 0 for d in t.shape):
            return f"input {spec.name!r}: shape {list(t.shape)} has a negative dimension"
    return None
