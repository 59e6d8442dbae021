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



def test_worksteal_order_shares_the_known_seconds_out_longest_first():
    from tests.durations import worksteal_order

    known = {"a": 400, "b": 200, "c": 200, "d": 100, "e": 90, "f": 10}
    nodeids = ["u1", "a", "u2", "b", "c", "u3", "d", "u4", "e", "f", "u5"]
    for workers in (1, 2, 3):
        order = worksteal_order(nodeids, workers, known)
        assert sorted(order) == list(range(len(nodeids)))  # every test once
        assert order == worksteal_order(nodeids, workers, known)  # every worker the same order
        # Cut as xdist hands out the first shares: each starts with its slow tests, longest first.
        shares, rest = [], order
        for i in range(workers):
            n = len(rest) // (workers - i)
            shares.append([nodeids[j] for j in rest[:n]])
            rest = rest[n:]
        loads = [sum(known.get(n, 0) for n in share) for share in shares]
        assert max(loads) - min(loads) <= max(known.values()), (workers, shares)
        for share in shares:
            secs = [known.get(n, 0) for n in share]
            assert secs == sorted(secs, reverse=True), share
    assert [nodeids[j] for j in worksteal_order(nodeids, 2, known)] == [
        "a", "d", "u1", "u2", "u3", "b", "c", "e", "f", "u4", "u5"]
