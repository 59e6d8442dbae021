"""The code passes its linter and its type check, as pyproject.toml configures them ([tool.ruff], [tool.mypy])."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plane.build import cache_root

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # ruff and mypy come with the test extra, into the same environment


def run(tool: str, *args: str, env: dict[str, str] | None = None, timeout: float) -> subprocess.CompletedProcess:
    exe = BIN / tool
    if not exe.is_file():
        pytest.fail(f"{tool} is not installed beside {sys.executable}: pip install -e '.[test]'")
    return subprocess.run([str(exe), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_ruff_finds_nothing():
    r = run("ruff", "check", "--no-cache", "src", "tests", "bench", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.timeout(360)
def test_mypy_finds_nothing():
    # Its cache outside the clone, beside the plane's builds: a warm run takes seconds, a cold one a minute.
    cache = cache_root() / "mypy"
    r = run("mypy", env={"MYPY_CACHE_DIR": str(cache)}, timeout=300)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
