"""A model in use: ``edl serve`` started as a process, held-out records sent to it over HTTP.

``edl demo`` ends with this: the published model served on a free port, its held-out split
sent in a few Open Inference Protocol requests, and the served accuracy set beside the
evaluate step's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np

from edl.errors import PermanentError
from edl.net import free_port

READY_TIMEOUT_S = 180.0  # kserve and onnxruntime take a while to import on a loaded machine
STOP_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Served:
    url: str  # the model's routes: URL/ready, URL/infer
    name: str


@contextlib.contextmanager
def running_server(model_uri: str, name: str, log: Path) -> Iterator[Served]:
    """``edl serve MODEL_URI`` on a free port until the block ends (then SIGTERM); its output to ``log``."""
    port = free_port()
    served = Served(f"http://127.0.0.1:{port}/v2/models/{name}", name)
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "edl", "serve", model_uri, "--port", str(port),
                                 "--name", name], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            _wait_ready(proc, served, log)
            yield served
        finally:
            _stop(proc)


def _wait_ready(proc: subprocess.Popen, served: Served, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PermanentError(f"edl serve exited {proc.returncode}: {_last_line(log)} (log: {log})")
        try:
            if httpx.get(f"{served.url}/ready", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.3)
    raise PermanentError(f"edl serve was not ready in {READY_TIMEOUT_S:.0f} s (log: {log})")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _last_line(log: Path) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def infer(served: Served, x: np.ndarray, input_name: str = "x") -> np.ndarray:
    """One Open Inference Protocol request (JSON) of the rows ``x``: the model's first output."""
    body = {"inputs": [{"name": input_name, "datatype": "FP32", "shape": list(x.shape),
                        "data": x.astype(np.float32).ravel().tolist()}]}
    r = httpx.post(f"{served.url}/infer", json=body, timeout=REQUEST_TIMEOUT_S)
    if r.status_code != 200:
        raise PermanentError(f"{served.url}/infer answered {r.status_code}: {r.text[:300]}")
    out = r.json()["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def served_accuracy(served: Served, x: np.ndarray, y: np.ndarray, requests: int) -> float:
    """Accuracy of the served model on ``x``, ``y``, sent in ``requests`` requests."""
    predicted = np.concatenate([infer(served, part).argmax(axis=1) for part in np.array_split(x, requests)])
    return float((predicted == y).mean())
