"""bench/control_scale.py, small: three jobs' sidecars on a real apiserver with hollow nodes cache the
cluster once (one of them decides for the namespace), and the benchmark reports what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.plane import build

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(600)
def test_three_jobs_sidecars_cache_the_cluster_once(tmp_path):
    build.build(build.KUBEPLANE, quiet=True)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "control_scale.py"), "--jobs", "1,3", "--nodes", "20",
                        "--pods", "700", "--period", "2", "--window", "8", "--churn", "2", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads((tmp_path / "control_scale.json").read_text())["rows"]
    one, three = rows
    # 500 trainer pods + 200 services (700), plus the churn's (at most 50 live): one copy however many jobs.
    assert 700 <= one["pods_cached_all"] <= 750 and 700 <= three["pods_cached_all"] <= 750, rows
    # One sidecar planned, every 2 s of the 8-s window (three deciding would make about 12).
    assert 2 <= three["decisions"] <= 6 and three["decision_max_s"] is not None, three
    assert three["watch_events_per_s"] > 0 and three["requests_per_s"] > 0
    assert (tmp_path / "control_scale.png").stat().st_size > 0
