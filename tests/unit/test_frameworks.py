"""Which framework a model definition uses, and the one-line refusals around it."""

from __future__ import annotations

import pytest

from edl.errors import UserError
from edl.frameworks import framework_of, load, of_object
from edl.modeldef import frameworks_imported, load_model_def

MIXED = """
import paddle
import torch
from edl.zoo.collate import collate

def model():
    return torch.nn.Linear(64, 10)

def loss(outputs, labels):
    return torch.nn.functional.cross_entropy(outputs, labels)

def optimizer(parameters, learning_rate):
    return paddle.optimizer.SGD(learning_rate=learning_rate, parameters=paddle.nn.Linear(1, 1).parameters())
"""

NEITHER = """
from edl.zoo.collate import collate

def model():
    return object()

def loss(outputs, labels):
    return 0.0

def optimizer(parameters, learning_rate):
    return None
"""


@pytest.mark.parametrize("model_def, framework", [("edl.zoo.digits", "paddle"), ("edl.zoo.torch.digits", "torch"),
                                                  ("edl.zoo.transformer", "paddle"),
                                                  ("edl.zoo.torch.transformer", "torch")])
def test_the_framework_is_what_model_returns_and_what_the_source_imports(model_def, framework):
    assert framework_of(load_model_def(model_def)) == framework
    assert frameworks_imported(model_def) == {framework}


def test_a_definition_that_mixes_frameworks_is_refused_in_one_line(tmp_path):
    f = tmp_path / "mixed.py"
    f.write_text(MIXED)
    md = load_model_def(str(f))
    assert framework_of(md) == "torch"
    with pytest.raises(UserError) as e:
        load("torch").replica(md, 0, 0.01, None)
    assert str(e.value) == (f"--model-def {f} mixes frameworks: model() returns a PyTorch model, optimizer() a "
                            f"PaddlePaddle SGD")


def test_a_model_of_neither_framework_is_refused_naming_what_it_is(tmp_path):
    f = tmp_path / "neither.py"
    f.write_text(NEITHER)
    with pytest.raises(UserError, match=r"model\(\) returned a builtins.object, neither a paddle.nn.Layer nor a "
                                        r"torch.nn.Module"):
        framework_of(load_model_def(str(f)))


def test_objects_are_told_apart_by_their_classes_modules():
    import numpy as np
    import torch

    assert of_object(torch.nn.Linear(1, 1)) == "torch"
    assert of_object(np.zeros(1)) is None
    with pytest.raises(UserError, match="unknown framework 'jax'"):
        load("jax")


def test_a_model_definition_that_cannot_be_found_imports_nothing_known():
    assert frameworks_imported("no_such_module.anywhere") == set()
    assert frameworks_imported("/nowhere/model.py") == set()
