"""The soak's short run (``bench/soak.py``): one epoch under a fault every 4 s on average, drawn from
every kind (trainer SIGKILL and SIGTERM, master SIGKILL, a hang, a scale change, an S3 outage where
MinIO is built, the launcher killed and its command run again). The job succeeds exactly once and
the report accounts for its time: kept plus lost is the wall time, each fault done is counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)

SOAK = Path(__file__).resolve().parents[3] / "bench" / "soak.py"


def test_a_short_soak_succeeds_exactly_once_and_accounts_for_its_time(tmp_path):
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, str(SOAK), "--epochs", "1", "--interval", "4", "--seed", "7",
                        "--keep", str(tmp_path / "work"), "--out", str(out), "--plot", str(tmp_path / "soak.png")],
                       capture_output=True, text=True, timeout=840)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    res = json.loads(out.read_text())
    assert res["status"] == "succeeded" and res["lost_samples"] == 0 and res["duplicate_samples"] == 0
    done = sum(k["count"] for k in res["faults"].values())
    assert done == len(res["fault_log"]) >= 3, res["fault_log"]
    lost = sum(sum(k["lost_s"]) for k in res["faults"].values()) + res["lost_before_first_fault_s"]
    assert res["kept_s"] + lost == pytest.approx(res["wall_s"], abs=0.5)
    assert 0 < res["effective_ratio"] <= 1
    assert (tmp_path / "soak.png").stat().st_size > 0
    assert "effective training time" in r.stdout
