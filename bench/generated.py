"""off / edl2017 / edl over generated scenarios (``edl.sim.generate``): tuning seeds and judged seeds.

    python bench/generated.py [--tune 1000:1020] [--judge 1:21] [--runs 1] [--no-bound] [--free-rescales]

The policy is tuned on the tuning seeds (1000-1019) and judged on disjoint ones (1-20). Prints and
writes, per seed set, the median and worst ratios of mean JCT between the policies, each policy's
utilization-to-bound and the services' worst lag in decision periods, and the JCT lower bound
(every job alone at its max) over each policy's mean JCT, to bench/results/generated.json.
``--free-rescales`` adds ``edl@free``: ``edl`` with every rescale pause at 0 s, which shows how much
of the gap the pauses account for. The same numbers for one set: ``edl simulate --generate 20 --seed 1
--compare off,edl2017,edl``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

from edl.sim.report import generated_benchmark  # noqa: E402

POLICIES = ["off", "edl2017", "edl"]


def seed_range(text: str) -> list[int]:
    lo, hi = (int(x) for x in text.split(":"))
    return list(range(lo, hi))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tune", default="1000:1020", help="tuning seeds, lo:hi (default 1000:1020); '' to skip")
    p.add_argument("--judge", default="1:21", help="judged seeds, lo:hi (default 1:21)")
    p.add_argument("--runs", type=int, default=1, help="runs per scenario and policy (default 1)")
    p.add_argument("--no-bound", action="store_true", help="skip the packing bound (faster)")
    p.add_argument("--free-rescales", action="store_true", help="also run edl with every rescale pause at 0 s")
    a = p.parse_args()
    policies = POLICIES + (["edl@free"] if a.free_rescales else [])
    console = Console()
    result: dict = {}
    for label, spec in (("tune", a.tune), ("judge", a.judge)):
        if not spec:
            continue

        def progress(row: dict, label: str = label) -> None:
            cells = ", ".join(f"{k} {v['jct_s_mean']:.0f} s" for k, v in row["policies"].items())
            console.print(f"[{label}] generated-{row['seed']}: {row['nodes']} nodes, {row['jobs']} jobs: {cells}")

        result[label] = generated_benchmark(seed_range(spec), policies, a.runs, bound=not a.no_bound,
                                            progress=progress)
        s = result[label]["summary"]
        pairs = ("edl/off", "edl/edl2017", "edl2017/off") + (("edl@free/off", "edl@free/edl2017")
                                                             if a.free_rescales else ())
        for pair in pairs:
            v = s["pairs"][pair]
            console.print(f"[{label}] mean JCT {pair}: median {v['median']:.3f}, worst {v['worst']:.3f}")
        for pol, v in s["policies"].items():
            ub = "-" if v["util_to_bound_median"] is None else f"{v['util_to_bound_median']:.3f}"
            console.print(f"[{label}] {pol}: util/bound median {ub}, service lag worst "
                          f"{v['lag_periods_worst']:.1f} periods, longest wait to train {v['pending_s_worst']:.0f} s, "
                          f"unfinished jobs {v['unfinished_jobs']}")
        for pol, v in s["jct_bound_over"].items():
            console.print(f"[{label}] JCT bound / {pol}: median {v['median']:.3f}, best {v['best']:.3f}")
    console.print(f"written to {write_result('generated', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
