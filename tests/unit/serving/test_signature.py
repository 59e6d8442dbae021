"""Whether a request fits a served model's inputs: the one-line reasons of edl serve's 400s."""

from __future__ import annotations

from edl.serving.signature import RequestTensor, TensorSpec, request_problem

X = TensorSpec("x", "FP32", (-1, 64))


def test_onnx_runtime_shapes_become_the_protocols_with_open_dimensions_as_minus_one():
    assert TensorSpec.of_onnx("x", "tensor(float)", ["DynamicDimension.0", 64]) == X
    assert TensorSpec.of_onnx("ids", "tensor(int64)", [None, 3]).to_json() == {
        "name": "ids", "datatype": "INT64", "shape": [-1, 3]}


def test_a_request_fits_any_batch_size():
    assert request_problem([X], [RequestTensor("x", "FP32", (1, 64))]) is None
    assert request_problem([X], [RequestTensor("x", "fp32", (500, 64))]) is None


def test_each_misfit_is_named_in_one_line():
    cases = {
        (("x", "FP32", (5, 10)),): "input 'x': shape [5, 10], the model takes [-1, 64] (-1: any size)",
        (("x", "FP32", (320,)),): "input 'x': shape [320], the model takes [-1, 64] (-1: any size)",
        (("x", "INT64", (5, 64)),): "input 'x': datatype INT64, the model takes FP32",
        (("images", "FP32", (5, 64)),): "input 'images' is not the model's; it takes 'x' (FP32, shape [-1, 64])",
        (): "input 'x' (FP32, shape [-1, 64]) is missing",
        (("x", "FP32", (1, 64)), ("x", "FP32", (1, 64))): "a request names an input twice",
        (("x", "FP32", (-2, 64)),): "input 'x': shape [-2, 64] has a negative dimension",
    }
    for given, reason in cases.items():
        problem = request_problem([X], [RequestTensor(*g) for g in given])
        assert problem == reason and "\n" not in problem
