"""The final model as ONNX beside the Paddle export: a real training run, then ONNX Runtime against Paddle."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import run_edl

pytestmark = pytest.mark.timeout(300)


def _held_out(digits) -> tuple[np.ndarray, np.ndarray]:
    from edl.data.dataset import Dataset
    from edl.data.splits import resolve_splits
    from edl.zoo.collate import collate

    _, test = resolve_splits(str(digits))
    return collate(Dataset(test, "held-out data").read_all())


def _own_export(framework: str, model_dir, x: np.ndarray) -> np.ndarray:
    """The framework's own exported model (not the ONNX one) on ``x``."""
    if framework == "paddle":
        import paddle

        model = paddle.jit.load(str(model_dir / "inference"))
        model.eval()
        return model(paddle.to_tensor(x)).numpy()
    import torch

    program = torch.export.load(str(model_dir / "model.pt2"))
    with torch.no_grad():
        return program.module()(torch.from_numpy(x)).numpy()


OWN_FILES = {"paddle": "inference.json", "torch": "model.pt2"}


def test_a_trained_digits_model_is_exported_as_onnx_that_agrees_with_the_framework(digits, tmp_path,
                                                                                 framework_digits):
    import onnxruntime as ort

    framework = "torch" if ".torch." in framework_digits else "paddle"
    ckpt = tmp_path / "ckpt"
    r = run_edl("train", "--job-name", "onnxdigits", "--model-def", framework_digits, "--data", str(digits),
                "--epochs", "3", "--batch-size", "32", "--trainers", "1", "--max-trainers", "1",
                "--checkpoint-uri", f"file://{ckpt}", "--summary-out", str(tmp_path / "s.json"), timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads((tmp_path / "s.json").read_text())["status"] == "succeeded"
    model_dir = ckpt / "model"
    assert (model_dir / "model.onnx").is_file() and (model_dir / OWN_FILES[framework]).is_file()

    x, y = _held_out(digits)
    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    (name,) = [i.name for i in session.get_inputs()]
    assert name == "x"
    onnx_logits = session.run(None, {name: x})[0]
    own_logits = _own_export(framework, model_dir, x)

    assert onnx_logits.shape == own_logits.shape == (len(y), 10)
    diff = float(np.abs(onnx_logits - own_logits).max())
    print(f"held-out records {len(y)}: max |ONNX Runtime - {framework}| on the logits {diff:.2e}")
    assert diff < 1e-4, diff
    assert (onnx_logits.argmax(axis=1) == own_logits.argmax(axis=1)).all()
    assert (onnx_logits.argmax(axis=1) == y).mean() > 0.5  # a trained model, not an untrained one compared to itself


UNCONVERTIBLE = {"paddle": '''
import paddle
from edl.zoo._classifier import collate, loss

class Scores(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(x) - paddle.lgamma(paddle.abs(self.fc(x)) + 1.0)  # lgamma: no ONNX converter for it

def model():
    return Scores()

def optimizer(parameters, learning_rate):
    return paddle.optimizer.Adam(learning_rate=learning_rate, parameters=parameters)
''', "torch": '''
import torch
from edl.zoo.collate import collate
from edl.zoo.torch._classifier import loss

class Scores(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(x) - torch.lgamma(self.fc(x).abs() + 1.0)  # lgamma: no ONNX converter for it

def model():
    return Scores()

def optimizer(parameters, learning_rate):
    return torch.optim.Adam(parameters, lr=learning_rate)
'''}
WHY = {"paddle": "unsupported operators", "torch": "'aten::lgamma' to ONNX opset version 17 is not supported"}


@pytest.mark.parametrize("framework", sorted(UNCONVERTIBLE))
def test_a_model_the_converter_cannot_take_keeps_its_own_export_and_the_log_says_why(digits, tmp_path, edl_home,
                                                                                     framework):
    model_def = tmp_path / "lgamma_model.py"
    model_def.write_text(UNCONVERTIBLE[framework])
    ckpt = tmp_path / "ckpt"
    r = run_edl("train", "--job-name", "noonnx", "--model-def", str(model_def), "--data", str(digits),
                "--epochs", "1", "--batch-size", "64", "--trainers", "1", "--max-trainers", "1",
                "--checkpoint-uri", f"file://{ckpt}", "--summary-out", str(tmp_path / "s.json"), timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads((tmp_path / "s.json").read_text())["status"] == "succeeded"
    assert (ckpt / "model" / OWN_FILES[framework]).is_file() and (ckpt / "model" / "params.npz").is_file()
    assert not (ckpt / "model" / "model.onnx").exists()
    logs = "".join(p.read_text(errors="replace") for p in edl_home.rglob("*.log")) + r.stdout + r.stderr
    (line,) = [ln for ln in logs.splitlines() if "no ONNX export" in ln]
    assert WHY[framework] in line, line
    assert "Torch IR graph" not in logs  # the exporter's dump of the graph stays out of the log


def _zoo() -> list[str]:
    import pkgutil

    import edl.zoo
    import edl.zoo.torch

    return ([f"edl.zoo.{m.name}" for m in pkgutil.iter_modules(edl.zoo.__path__) if m.ispkg is False
             and not m.name.startswith("_") and m.name != "collate"]
            + [f"edl.zoo.torch.{m.name}" for m in pkgutil.iter_modules(edl.zoo.torch.__path__)
               if not m.name.startswith("_")])


# A batch of 64 for each of the zoo's networks (the same in both frameworks).
INPUTS = {"digits": lambda rng: rng.standard_normal((64, 64)).astype(np.float32),
          "mlp": lambda rng: rng.standard_normal((64, 256)).astype(np.float32),
          "transformer": lambda rng: rng.integers(0, 8192, (64, 64)).astype(np.int64)}


@pytest.mark.parametrize("model_def", _zoo())
def test_every_zoo_model_is_exported_as_onnx_that_agrees_with_its_framework(model_def, tmp_path):
    """The trainer's export of each model the zoo ships (untrained, seeded: the conversion does not
    care how the weights came about) against the framework on the same random batch."""
    import onnxruntime as ort

    from edl.frameworks import framework_of, load
    from edl.modeldef import load_model_def
    from edl.storage.store import open_store
    from edl.trainer.export import export_model

    md = load_model_def(model_def)
    framework = framework_of(md)
    replica = load(framework).replica(md, 1, 0.01, None)
    x = INPUTS[model_def.rsplit(".", 1)[1]](np.random.default_rng(1))
    replica.warm_up(x, np.zeros(64, np.int64))
    export_model(replica, open_store(str(tmp_path)))
    onnx_file = tmp_path / "model" / "model.onnx"
    assert onnx_file.is_file(), f"{model_def}: no ONNX export"
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    (input_name,) = [i.name for i in session.get_inputs()]
    onnx_logits = session.run(None, {input_name: x})[0]
    _, own_logits = replica.evaluate(x, np.zeros(64, np.int64))
    assert onnx_logits.shape == own_logits.shape
    assert float(np.abs(onnx_logits - own_logits).max()) < 1e-4
    assert (onnx_logits.argmax(axis=1) == own_logits.argmax(axis=1)).all()
    assert (tmp_path / "model" / OWN_FILES[framework]).is_file()
