"""Static check of the whole tree: no unused imports or names, no undefined names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pyflakes_finds_nothing():
    out = subprocess.run([sys.executable, "-m", "pyflakes", "src", "tests", "bench"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_layers_hold():
    """The contracts in .importlinter: the layers (siblings side by side, nothing imports upward), the
    processes that import none of each other, the pipeline's and the frameworks' own order, and the edges:
    the one place each of kubernetes, PaddlePaddle, PyTorch, KFP and Hera, Starlette and uvicorn, rich is imported."""
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--config", str(ROOT / ".importlinter")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_only_the_collective_module_reaches_into_paddle_base():
    """``paddle.base.core`` is Paddle's private C++ surface: one module wraps it (import-linter
    cannot name a subpackage of an external package, hence this check)."""
    import ast

    offenders = []
    for path in sorted((ROOT / "src" / "edl").rglob("*.py")):
        if path.relative_to(ROOT / "src").as_posix() == "edl/frameworks/paddle/group.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                names = [f"{node.value.id}.{node.attr}"]
            offenders += [f"{path.name}:{node.lineno} {n}" for n in names if n == "paddle.base" or
                          n.startswith("paddle.base.")]
    assert not offenders, offenders
