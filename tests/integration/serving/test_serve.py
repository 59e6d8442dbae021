"""``edl serve``: a real server process on a free port, real HTTP requests in the Open Inference Protocol."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from edl.net import free_port
from tests.conftest import edl_cmd, run_edl

pytestmark = pytest.mark.timeout(300)

READY_TIMEOUT_S = 150  # kserve and onnxruntime import slowly on a loaded 2-core machine


DIGITS = {"paddle": "edl.zoo.digits", "torch": "edl.zoo.torch.digits"}


def _export(framework: str, root: Path) -> tuple[Path, object]:
    """A digits model written by the trainer's own export (the framework's and ONNX), and a function
    of a batch giving the framework's own outputs."""
    from edl.frameworks import load
    from edl.modeldef import load_model_def
    from edl.storage.store import open_store
    from edl.trainer.export import export_model

    replica = load(framework).replica(load_model_def(DIGITS[framework]), 3, 0.01, None)
    replica.warm_up(np.zeros((2, 64), np.float32), np.zeros(2, np.int64))
    export_model(replica, open_store(str(root)))
    return root / "model", lambda x: replica.evaluate(x, np.zeros(len(x), np.int64))[1]


@pytest.fixture(scope="module", params=sorted(DIGITS))
def exported(request, tmp_path_factory) -> tuple[Path, object]:
    return _export(request.param, tmp_path_factory.mktemp("exported"))


@pytest.fixture(scope="module")
def exported_paddle(tmp_path_factory) -> tuple[Path, object]:
    return _export("paddle", tmp_path_factory.mktemp("exported"))


class Server:
    def __init__(self, model_uri: str, name: str | None, log: Path, env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        args = ["serve", model_uri, "--port", str(self.port)] + (["--name", name] if name else [])
        self._out = log.open("wb")
        self.proc = subprocess.Popen(edl_cmd(*args), stdout=self._out, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})}, start_new_session=True)

    def wait_ready(self, name: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"edl serve exited {self.proc.returncode}:\n{self.output()}"
            try:
                if httpx.get(f"{self.url}/v2/models/{name}/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"edl serve not ready in {READY_TIMEOUT_S} s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._out.close()


@pytest.fixture
def serve(tmp_path):
    servers: list[Server] = []

    def start(model_uri: str, name: str | None = None, env: dict | None = None) -> Server:
        servers.append(Server(model_uri, name, tmp_path / f"serve-{len(servers)}.log", env))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def _request(x: np.ndarray, name: str = "x", datatype: str = "FP32", shape: list[int] | None = None) -> dict:
    return {"id": "r1", "inputs": [{"name": name, "datatype": datatype, "shape": shape or list(x.shape),
                                    "data": x.flatten().tolist()}]}


def test_serve_answers_ready_metadata_and_infer_like_the_framework_and_rejects_bad_requests(exported, digits, serve):
    from edl.data.dataset import Dataset, resolve_splits
    from edl.zoo.collate import collate

    model_dir, own_outputs = exported
    server = serve(f"file://{model_dir}", "digits")
    server.wait_ready("digits")
    x, _ = collate(Dataset(resolve_splits(str(digits))[1], "held-out").read_all())
    x = x[:5]

    meta = httpx.get(f"{server.url}/v2/models/digits", timeout=10).json()
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}]
    r = httpx.post(f"{server.url}/v2/models/digits/infer", json=_request(x), timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model_name"] == "digits" and body["id"] == "r1"
    (out,) = body["outputs"]
    assert out["datatype"] == "FP32" and out["shape"] == [5, 10]
    served = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    np.testing.assert_allclose(served, own_outputs(x), atol=1e-5)

    bad = {
        "shape": _request(x[:, :10]),  # 10 features, the model takes 64
        "rank": _request(x, shape=[5 * 64]),
        "fill": _request(x, shape=[4, 64]),  # 320 values do not make 4 rows of 64
        "datatype": _request(x.astype(np.int64), datatype="INT64"),
        "input name": _request(x, name="images"),
    }
    for what, request in bad.items():
        r = httpx.post(f"{server.url}/v2/models/digits/infer", json=request, timeout=30)
        assert r.status_code == 400, (what, r.status_code, r.text)
        error = r.json()["error"]
        assert error and "\n" not in error, (what, error)
    assert "shape [5, 10], the model takes [-1, 64]" in httpx.post(
        f"{server.url}/v2/models/digits/infer", json=bad["shape"], timeout=30).json()["error"]

    r = httpx.post(f"{server.url}/v2/models/nosuch/infer", json=_request(x), timeout=30)
    assert r.status_code == 404, r.text
    assert httpx.get(f"{server.url}/v2/models/nosuch/ready", timeout=10).status_code == 404

    # KServe's v1 protocol too, for the same model.
    r = httpx.post(f"{server.url}/v1/models/digits:predict", json={"instances": x.tolist()}, timeout=30)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(np.asarray(r.json()["predictions"]), served, atol=1e-6)

    # SIGTERM (Kubernetes, systemd) ends it cleanly.
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0, server.output()
    assert "Traceback" not in server.output(), server.output()


def test_serve_from_s3_under_the_default_name(exported_paddle, s3, serve):
    from edl.storage.store import open_store

    model_dir, _ = exported_paddle
    store = open_store("s3://models/digits/model")
    store.check()
    for f in model_dir.iterdir():
        store.put(f.name, f.read_bytes())
    server = serve("s3://models/digits/model", env=s3.env)
    server.wait_ready("model")
    r = httpx.post(f"{server.url}/v2/models/model/infer", json=_request(np.ones((2, 64), np.float32)), timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [2, 10], r.text
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(60) == 0, server.output()


def test_serve_refuses_a_model_directory_without_onnx_in_one_line(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "params.npz").write_bytes(b"")
    r = run_edl("serve", str(tmp_path / "model"), "--port", str(free_port()), timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("edl: error: MODEL_URI") and "model.onnx" in r.stderr
    assert "Traceback" not in r.stderr
