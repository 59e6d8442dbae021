"""``--model-def``: what the user's functions raise comes out as ``UserCodeError`` with its fingerprint."""

from __future__ import annotations

import paddle
import pytest

from edl.errors import StorageError, UserCodeError, UserError
from edl.modeldef import load_model_def

MODEL = """
import paddle
from edl.zoo.digits import optimizer, loss

def model():
    return paddle.nn.Linear(63, 10)

def collate(table):
    if table is None:
        raise RuntimeError("no column 'pixels'\\nsecond line of detail")
    if table == "edl":
        from edl.errors import StorageError
        raise StorageError("the store is away")
    if table == "oom":
        raise MemoryError("out of memory")
    return table
"""


@pytest.fixture
def md(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(MODEL)
    return load_model_def(str(f))


def test_an_exception_in_a_user_function_names_the_part_and_its_first_line(md):
    with pytest.raises(UserCodeError) as e:
        md.collate(None)
    err = e.value
    assert err.part == "collate()" and isinstance(err.cause, RuntimeError) and err.step == 0
    assert err.fingerprint == "RuntimeError: no column 'pixels'"
    assert str(err).startswith(f"--model-def {md.name}: collate() raised RuntimeError: no column")
    assert "second line" not in str(err)


def test_a_shape_error_in_the_forward_is_the_user_s_code(md):
    model = md.model()
    with pytest.raises(UserCodeError) as e:
        md.forward(model, paddle.zeros([2, 64]))
    assert e.value.part == "the model's forward"
    assert e.value.fingerprint.startswith("ValueError: (InvalidArgument) In operator matmul")
    assert "\n" not in e.value.fingerprint and len(e.value.fingerprint) < 450


def test_edl_s_own_errors_and_memory_pass_through(md):
    with pytest.raises(StorageError):
        md.collate("edl")
    with pytest.raises(MemoryError):
        md.collate("oom")
    assert md.collate("fine") == "fine"


def test_a_definition_given_as_source_runs_as_its_module_named_by_its_uri():
    md = load_model_def("s3://models/team/m.py", "from edl.zoo.digits import collate, loss, model, optimizer\n")
    assert md.module.__file__ == "s3://models/team/m.py" and callable(md.model)
    with pytest.raises(UserError, match=r"s3://models/team/bad.py.*SyntaxError.*line 2") as e:
        load_model_def("s3://models/team/bad.py", "import os\ndef model(:\n")
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="does not define model, loss, optimizer, collate"):
        load_model_def("s3://models/team/empty.py", "")
