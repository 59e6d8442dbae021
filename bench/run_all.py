"""Run every benchmark in turn (``./dev bench``); each prints its table and writes bench/results/*.json."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

for script in ("throughput.py", "overhead.py", "checkpoint_cost.py", "group_formation.py", "recovery.py", "recovery_master.py", "accuracy.py",
               "policy_speed.py", "sidecar_scale.py", "sim_speed.py"):
    print(f"\n=== bench/{script}", flush=True)
    subprocess.run([sys.executable, str(HERE / script)], check=True)
