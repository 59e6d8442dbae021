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
