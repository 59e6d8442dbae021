"""The exported Paddle inference model, converted to ONNX by ``paddle2onnx`` (run as its own process).

Why a process of its own: paddle2onnx 2.1.0's converter (C++) aborts the whole process
(SIGABRT) when a model holds an operator it cannot convert, so converting inside the
trainer would kill rank 0 at the end of a job. The child converts, and the trainer reads
its exit: a model the converter cannot take keeps its Paddle export, and the log says why
in one line.

Nothing is installed at run time: the conversion calls ``paddle2onnx.export`` without its
optional post-pass (``optimize_tool="polygraphy"``, the default, sets
``POLYGRAPHY_AUTOINSTALL_DEPS=1`` and lets Polygraphy pip-install ``onnx_graphsurgeon``);
the converter's own graph optimisation (``enable_optimize``) still runs. The ONNX
checker validates the result.

``python -m edl.frameworks.paddle.onnx_export MODEL.json PARAMS.pdiparams OUT.onnx``
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

OPSET = 13  # the converter raises it by itself where an operator needs a newer one
CONVERT_TIMEOUT_S = 300.0


def convert(model_file: Path, params_file: Path, out: Path, timeout_s: float = CONVERT_TIMEOUT_S) -> str | None:
    """Write ``out`` (ONNX) from a ``paddle.jit.save`` export; answers None, or why it could not."""
    cmd = [sys.executable, "-m", "edl.frameworks.paddle.onnx_export", str(model_file), str(params_file), str(out)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"paddle2onnx did not finish in {timeout_s:.0f} s"
    if r.returncode == 0 and out.is_file() and out.stat().st_size > 0:
        return None
    out.unlink(missing_ok=True)
    return _reason(r.returncode, r.stdout + r.stderr)


def _reason(returncode: int, output: str) -> str:
    """One line out of the converter's output: its own error line where it wrote one."""
    errors = [line.strip() for line in output.splitlines() if "[ERROR]" in line or line.startswith("edl-onnx:")]
    if errors:
        return errors[-1].removeprefix("edl-onnx:").replace("[ERROR][Paddle2ONNX] ", "").strip()
    how = f"signal {-returncode}" if returncode < 0 else f"exit {returncode}"
    return f"paddle2onnx failed ({how})"


def _main(argv: list[str]) -> int:
    model_file, params_file, out = argv
    import onnx
    import paddle2onnx

    try:
        # save_file=None: the model's bytes come back, and neither optimize_tool pass runs (see above).
        data = paddle2onnx.export(model_file, params_file, save_file=None, opset_version=OPSET,
                                  auto_upgrade_opset=True, enable_onnx_checker=True, enable_optimize=True,
                                  optimize_tool="none")
    except NameError:  # paddle2onnx logged its error and had no model to return
        print("edl-onnx: paddle2onnx could not convert the model (its log above)", file=sys.stderr)
        return 1
    onnx.checker.check_model(onnx.load_model_from_string(data), full_check=True)
    Path(out).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
