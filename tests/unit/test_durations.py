"""The tests' seconds the suite measures of itself (``tests/durations.py``): the order they give xdist's
workers, how a run's seconds are merged into the cache, and where that cache is."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tests import durations
from tests.durations import Recorder, known, load, merge, update, worksteal_order

REPO = Path(__file__).resolve().parents[2]


def shares_of(nodeids: list[str], order: list[int], workers: int) -> list[list[str]]:
    """``order`` cut as xdist hands out the first shares."""
    shares, rest = [], order
    for i in range(workers):
        n = len(rest) // (workers - i)
        shares.append([nodeids[j] for j in rest[:n]])
        rest = rest[n:]
    return shares


def test_worksteal_order_shares_the_seconds_out_longest_first():
    seconds = {"a": 400, "b": 200, "c": 200, "d": 100, "e": 90, "f": 10}
    nodeids = ["u1", "a", "u2", "b", "c", "u3", "d", "u4", "e", "f", "u5"]
    for workers in (1, 2, 3):
        order = worksteal_order(nodeids, workers, seconds, slow_s=0)
        assert sorted(order) == list(range(len(nodeids)))  # every test once
        assert order == worksteal_order(nodeids, workers, seconds, slow_s=0)  # every worker the same order
        shares = shares_of(nodeids, order, workers)  # each starts with its slow tests, longest first
        loads = [sum(seconds.get(n, 0) for n in share) for share in shares]
        assert max(loads) - min(loads) <= max(seconds.values()), (workers, shares)
        for share in shares:
            secs = [seconds.get(n, 0) for n in share]
            assert secs == sorted(secs, reverse=True), share
    assert [nodeids[j] for j in worksteal_order(nodeids, 2, seconds, slow_s=0)] == [
        "a", "d", "u1", "u2", "u3", "b", "c", "e", "f", "u4", "u5"]


def test_short_tests_keep_the_collections_order_after_the_slow_ones():
    # A full cache times every test; only the slow ones move (the others' modules keep their fixtures).
    nodeids = ["m1::a", "m1::b", "m2::slow", "m2::c", "m3::d", "m3::slower"]
    seconds = {"m1::a": 0.1, "m1::b": 3.0, "m2::slow": 60.0, "m2::c": 0.2, "m3::d": 14.9, "m3::slower": 90.0}
    order = [nodeids[i] for i in worksteal_order(nodeids, 2, seconds)]
    assert order == ["m3::slower", "m1::a", "m1::b", "m2::slow", "m2::c", "m3::d"]


def test_a_renamed_or_removed_test_in_the_seconds_changes_nothing():
    nodeids = ["t::x", "t::y", "t::z", "t::w"]
    renamed = {"t::old_name": 500.0, "t::y": 30.0, "gone.py::t": 80.0}
    assert worksteal_order(nodeids, 2, renamed) == worksteal_order(nodeids, 2, {"t::y": 30.0})
    assert sorted(worksteal_order(nodeids, 2, renamed)) == [0, 1, 2, 3]


def test_a_run_s_seconds_replace_those_of_its_tests_and_keep_the_others():
    cached = {"a": 10.0, "b": 20.0}
    assert merge(cached, {"b": 25.123, "c": 1.0}) == {"a": 10.0, "b": 25.12, "c": 1.0}
    assert merge({}, {"x": float("nan"), "y": -1.0, "z": 2.0}) == {"z": 2.0}  # nonsense is not cached
    assert cached == {"a": 10.0, "b": 20.0}


def test_the_seed_counts_only_for_tests_this_machine_never_timed():
    seed = {"slow": 100.0, "renamed": 50.0}
    assert known({}, seed) == seed  # a fresh machine
    assert known({"slow": 40.0, "new": 20.0}, seed) == {"slow": 40.0, "renamed": 50.0, "new": 20.0}


def test_every_seed_entry_is_a_test_id_with_seconds():
    for nodeid, s in durations.SEED.items():
        assert nodeid.startswith("tests/") and ".py::" in nodeid and s >= durations.SLOW_S, nodeid


def test_the_cache_is_outside_the_clone(monkeypatch, tmp_path):
    monkeypatch.setenv("EDL_CACHE_DIR", str(tmp_path / "c"))
    assert durations.cache_path() == tmp_path / "c" / "test-durations.json"
    monkeypatch.delenv("EDL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert durations.cache_path() == tmp_path / "xdg" / "edl" / "test-durations.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert durations.cache_path() == tmp_path / "home" / ".cache" / "edl" / "test-durations.json"
    assert not durations.cache_path().is_relative_to(REPO)


def test_no_cache_or_an_unreadable_one_reads_as_nothing(tmp_path):
    path = tmp_path / "test-durations.json"
    assert load(path) == {}
    path.write_text("{not json")
    assert load(path) == {}
    path.write_text(json.dumps(["a", 1]))
    assert load(path) == {}
    path.write_text(json.dumps({"a": 1.5, "b": "slow", "c": True}))
    assert load(path) == {"a": 1.5}


def test_update_merges_into_the_file_whole(tmp_path):
    path = tmp_path / "cache" / "test-durations.json"
    assert update(path, {"a": 1.0}) == {"a": 1.0}  # the folder is made
    assert update(path, {"b": 2.0}) == {"a": 1.0, "b": 2.0}
    assert load(path) == {"a": 1.0, "b": 2.0}
    assert sorted(p.name for p in path.parent.iterdir()) == ["test-durations.json", "test-durations.json.lock"]


def report(nodeid: str, when: str, duration: float, outcome: str = "passed") -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, when=when, duration=duration, passed=outcome == "passed",
                           failed=outcome == "failed", skipped=outcome == "skipped")


def test_the_recorder_adds_up_setup_call_and_teardown_of_the_tests_that_passed(tmp_path):
    path = tmp_path / "test-durations.json"
    path.write_text(json.dumps({"t::kept": 9.0, "t::a": 100.0, "t::b": 7.0, "t::c": 80.0}))
    rec = Recorder(path)
    for r in (report("t::a", "setup", 1.0), report("t::a", "call", 2.5), report("t::a", "teardown", 0.5),
              report("t::b", "setup", 0.1), report("t::b", "call", 30.0, "failed"), report("t::b", "teardown", 0.1),
              report("t::c", "setup", 0.01, "skipped"), report("t::c", "teardown", 0.0),  # a slow one, skipped
              report("t::d", "setup", 0.2), report("t::d", "call", 5.0), report("t::d", "teardown", 1.0, "failed")):
        rec.pytest_runtest_logreport(r)
    assert rec.measured() == {"t::a": 4.0}
    rec.pytest_sessionfinish(session=None)
    assert load(path) == {"t::kept": 9.0, "t::a": 4.0, "t::b": 7.0, "t::c": 80.0}


def test_a_cache_that_cannot_be_written_does_not_fail_the_run(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    rec = Recorder(blocker / "test-durations.json")  # a folder that cannot be made
    rec.pytest_runtest_logreport(report("t::a", "call", 1.0))
    rec.pytest_sessionfinish(session=None)
    assert "not cached" in capsys.readouterr().err
