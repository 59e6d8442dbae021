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
    from edl.zoo._classifier import collate

    _, test = resolve_splits(str(digits))
    return collate(Dataset(test, "held-out data").read_all())


def test_a_trained_digits_model_is_exported_as_onnx_that_agrees_with_paddle(digits, tmp_path):
    import onnxruntime as ort
    import paddle

    ckpt = tmp_path / "ckpt"
    r = run_edl("train", "--job-name", "onnxdigits", "--model-def", "edl.zoo.digits", "--data", str(digits),
                "--epochs", "3", "--batch-size", "32", "--trainers", "1", "--max-trainers", "1",
                "--checkpoint-uri", f"file://{ckpt}", "--summary-out", str(tmp_path / "s.json"), timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads((tmp_path / "s.json").read_text())["status"] == "succeeded"
    model_dir = ckpt / "model"
    assert (model_dir / "model.onnx").is_file() and (model_dir / "inference.json").is_file()

    x, y = _held_out(digits)
    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    (name,) = [i.name for i in session.get_inputs()]
    onnx_logits = session.run(None, {name: x})[0]
    paddle_model = paddle.jit.load(str(model_dir / "inference"))
    paddle_model.eval()
    paddle_logits = paddle_model(paddle.to_tensor(x)).numpy()

    assert onnx_logits.shape == paddle_logits.shape == (len(y), 10)
    diff = float(np.abs(onnx_logits - paddle_logits).max())
    print(f"held-out records {len(y)}: max |ONNX Runtime - Paddle| on the logits {diff:.2e}")
    assert diff < 1e-4, diff
    assert (onnx_logits.argmax(axis=1) == paddle_logits.argmax(axis=1)).all()
    assert (onnx_logits.argmax(axis=1) == y).mean() > 0.5  # a trained model, not an untrained one compared to itself


UNCONVERTIBLE = '''
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
'''


def test_a_model_the_converter_cannot_take_keeps_its_paddle_export_and_the_log_says_why(digits, tmp_path, edl_home):
    model_def = tmp_path / "lgamma_model.py"
    model_def.write_text(UNCONVERTIBLE)
    ckpt = tmp_path / "ckpt"
    r = run_edl("train", "--job-name", "noonnx", "--model-def", str(model_def), "--data", str(digits),
                "--epochs", "1", "--batch-size", "64", "--trainers", "1", "--max-trainers", "1",
                "--checkpoint-uri", f"file://{ckpt}", "--summary-out", str(tmp_path / "s.json"), timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads((tmp_path / "s.json").read_text())["status"] == "succeeded"
    assert (ckpt / "model" / "inference.json").is_file() and (ckpt / "model" / "params.npz").is_file()
    assert not (ckpt / "model" / "model.onnx").exists()
    logs = "".join(p.read_text(errors="replace") for p in edl_home.rglob("*.log")) + r.stdout + r.stderr
    (line,) = [ln for ln in logs.splitlines() if "no ONNX export" in ln]
    assert "unsupported operators" in line, line


def _zoo() -> list[str]:
    import pkgutil

    import edl.zoo

    return sorted(m.name for m in pkgutil.iter_modules(edl.zoo.__path__) if not m.name.startswith("_"))


@pytest.mark.parametrize("name", _zoo())
def test_every_zoo_model_is_exported_as_onnx_that_agrees_with_paddle(name, tmp_path):
    """The trainer's export of each model the zoo ships (untrained, seeded: the conversion does not
    care how the weights came about) against Paddle on the same random batch."""
    import onnxruntime as ort
    import paddle

    from edl.modeldef import load_model_def
    from edl.storage.store import open_store
    from edl.trainer.export import export_model

    paddle.seed(1)
    model = load_model_def(f"edl.zoo.{name}").model()
    width = next(layer for layer in model.sublayers() if isinstance(layer, paddle.nn.Linear)).weight.shape[0]
    x = np.random.default_rng(1).standard_normal((64, width)).astype(np.float32)
    export_model(model, x[:1], open_store(str(tmp_path)))
    onnx_file = tmp_path / "model" / "model.onnx"
    assert onnx_file.is_file(), f"edl.zoo.{name}: no ONNX export"
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    (input_name,) = [i.name for i in session.get_inputs()]
    onnx_logits = session.run(None, {input_name: x})[0]
    model.eval()
    paddle_logits = model(paddle.to_tensor(x)).numpy()
    assert onnx_logits.shape == paddle_logits.shape
    assert float(np.abs(onnx_logits - paddle_logits).max()) < 1e-4
    assert (onnx_logits.argmax(axis=1) == paddle_logits.argmax(axis=1)).all()
