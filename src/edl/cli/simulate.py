"""``edl simulate``: a cluster of elastic jobs in virtual time under a scaling policy, and its tables."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from edl.autoscale.policy import POLICY_NAMES
from edl.errors import UserError

if TYPE_CHECKING:
    from edl.console import Console


def _pct(v: float | None, *bounds: float | None) -> str:
    """A utilization and, in brackets, the most a policy could reach (``edl.sim.bound``): with every
    pod packed, then (where known) around the services as they ran, and around the services and fixed
    pods as they ran (what placing trainers alone can reach)."""
    if v is None:
        return "-"
    known = [f"{100 * b:.1f}" for b in bounds if b is not None]
    return f"{100 * v:.1f}" + (f" ({' · '.join(known)})" if known else "")


def cmd_simulate(a: argparse.Namespace) -> int:
    from edl.console import plain_console
    from edl.files import write_json_atomic
    from edl.sim.report import plot, simulate
    from edl.sim.scenario import load

    if a.runs < 1:
        raise UserError(f"--runs must be at least 1 (got {a.runs})")
    if (a.scenario is None) == (a.generate is None):
        raise UserError("give either --scenario FILE or --generate N")
    policies = [p.strip() for p in a.compare.split(",")] if a.compare else [a.policy]
    known = _simulated_policies()
    for p in policies:
        if p not in known:
            raise UserError(f"unknown policy {p!r}; choose from {', '.join(known)}")
    if a.generate is not None:
        return _simulate_generated(a, policies)
    scenario = load(a.scenario)
    reports = []
    for p in policies:
        report, sim = simulate(scenario, p, a.runs, a.seed)
        reports.append(report)
        if a.plot:
            path = Path(a.plot)
            if len(policies) > 1:
                path = path.with_name(f"{path.stem}-{p}{path.suffix}")
            plot(sim, path, f"{scenario.name} · policy {p}")
    show_simulation(plain_console(), scenario.name, a.runs, reports)
    if a.out:
        write_json_atomic(Path(a.out), reports[0] if len(reports) == 1 else {"compare": reports})
    return 0


def show_simulation(console: Console, scenario: str, runs: int, reports: list[dict]) -> None:
    """``edl simulate``: one row per policy."""
    from edl.console import add_row, table, text

    t = table(*((c, "right") for c in ("policy", "util % (bounds)", "off-peak % (bounds)", "pending s", "JCT s",
                                       "Jain", "svc lag s", "rescales")),
              title=text(f"{scenario}: {runs} run(s) per policy"),
              caption="bounds: every pod packed · around the services as they ran · around the services "
                      "and fixed pods as they ran")
    for r in reports:
        u = r["utilization"]
        add_row(t, r["policy"],
                _pct(u["mean"], u["bound_mean"], u.get("job_pods_bound_mean"), u.get("trainers_bound_mean")),
                _pct(u["offpeak_mean"], u["bound_offpeak_mean"], u.get("job_pods_bound_offpeak_mean"),
                     u.get("trainers_bound_offpeak_mean")),
                f"{r['pending_s_mean']:.1f}", "-" if r["jct_s_mean"] is None else f"{r['jct_s_mean']:.0f}",
                f"{r['fairness_jain']:.2f}",
                "-" if not r["services"] else f"{max(s['lag_s_max'] for s in r['services']):.0f}",
                f"{r['rescale_events']:.0f}")
    console.print(t)


def _simulate_generated(a: argparse.Namespace, policies: list[str]) -> int:
    """``edl simulate --generate N --seed S``: the policies over generated scenarios S..S+N-1."""
    from edl.console import plain_console, table
    from edl.files import write_json_atomic
    from edl.sim.report import generated_benchmark

    if a.generate < 1:
        raise UserError(f"--generate must be at least 1 (got {a.generate})")
    console = plain_console()

    def progress(row: dict) -> None:
        cells = "  ".join(f"{p} {v['jct_s_mean']:.0f} s" for p, v in row["policies"].items())
        console.print(f"generated-{row['seed']}: {row['nodes']} nodes, {row['jobs']} jobs; mean JCT {cells}")

    result = generated_benchmark(list(range(a.seed, a.seed + a.generate)), policies, a.runs, bound=not a.no_bound,
                                 progress=progress)
    t = table(*((c, "right") for c in ("policies", "median", "worst", "best")),
              title=f"{a.generate} generated scenarios (seeds {a.seed}..{a.seed + a.generate - 1}): "
                    "mean-JCT ratios (below 1: faster)")
    for pair, v in result["summary"]["pairs"].items():
        t.add_row(pair, f"{v['median']:.3f}", f"{v['worst']:.3f}", f"{v['best']:.3f}")
    console.print(t)
    u = table(*((c, "right") for c in ("policy", "util/bound median", "util/bound worst", "svc lag periods median",
                                       "worst", "longest wait s", "unfinished jobs")),
              title="per policy")
    for p, v in result["summary"]["policies"].items():
        u.add_row(p, "-" if v["util_to_bound_median"] is None else f"{v['util_to_bound_median']:.3f}",
                  "-" if v["util_to_bound_worst"] is None else f"{v['util_to_bound_worst']:.3f}",
                  f"{v['lag_periods_median']:.1f}", f"{v['lag_periods_worst']:.1f}", f"{v['pending_s_worst']:.0f}",
                  str(v["unfinished_jobs"]))
    console.print(u)
    if a.out:
        write_json_atomic(Path(a.out), result)
    return 0


def _simulated_policies() -> tuple[str, ...]:
    """What ``edl simulate`` runs: "off" (static trainer counts) and every registered policy."""
    from edl.autoscale.policy import POLICY_NAMES

    return ("off", *POLICY_NAMES)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``simulate`` command."""
    sim = sub.add_parser("simulate", help="simulate a cluster with elastic jobs under a scaling policy",
                         description="Run a scenario in virtual time with the same policy code the sidecar runs.")
    sim.add_argument("--scenario", default=None, help="a scenario YAML file, or seed-case1 / seed-case2")
    sim.add_argument("--generate", type=int, default=None, metavar="N",
                     help="instead of --scenario: N generated scenarios (edl.sim.generate), seeds --seed.."
                          "--seed+N-1, each run --runs times; prints median and worst ratios")
    sim.add_argument("--no-bound", action="store_true", help="with --generate: skip the packing bound (faster)")
    sim.add_argument("--policy", default="edl", help=f"off (static trainer counts), {' or '.join(POLICY_NAMES)} "
                                                     "(default edl)")
    sim.add_argument("--compare", default=None,
                     help=f"comma-separated policies to run side by side, e.g. {','.join(_simulated_policies())}")
    sim.add_argument("--runs", type=int, default=1, help="runs with consecutive seeds, averaged (default 1)")
    sim.add_argument("--seed", type=int, default=0,
                     help="first seed (default 0): of the runs, or with --generate of the scenarios")
    sim.add_argument("--out", default=None, help="write the JSON report here")
    sim.add_argument("--plot", default=None, help="write a PNG of utilization, trainers, pending jobs and services")
    sim.set_defaults(fn=cmd_simulate)
