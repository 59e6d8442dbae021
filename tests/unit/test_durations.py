"""The slow tests ``tests/durations.py`` orders first are still there, under the same names."""

from __future__ import annotations

import re
from pathlib import Path

from tests.durations import KNOWN_S

REPO = Path(__file__).resolve().parents[2]


def test_every_known_slow_test_exists_under_its_name():
    missing = []
    for nodeid in KNOWN_S:
        path, name = nodeid.split("::")
        name = name.split("[")[0]  # a parametrized test's id
        file = REPO / path
        if not file.is_file() or not re.search(rf"^def {re.escape(name)}\(", file.read_text(), re.M):
            missing.append(nodeid)
    assert not missing, f"renamed or removed; update tests/durations.py: {missing}"

