"""MkDocs hook: tables generated from the benchmarks' result files at build time, so that a page's figures
are those of a file in ``bench/results`` (which names its command and commit), never typed in by hand.

A page asks for one with a comment on a line of its own:

- ``<!-- chains: bench/results/NAME.json -->``: a soak's per-kind breakdown of where each fault's time
  went (``bench/soak.py``'s ``chains``), with the command and commit that measured it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"^<!-- chains: (\S+) -->$", re.MULTILINE)
KIND_NAMES = {"pod-delete": "trainer pod deleted", "pod-kill": "trainer pod deleted by force",
              "master-delete": "master pod deleted", "node-lost": "node lost 20 s",
              "apiserver-stop": "apiserver stopped 10 s", "trainer-sigkill": "trainer SIGKILLed",
              "trainer-sigterm": "trainer SIGTERMed"}


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def chains_table(rel: str) -> str:
    path = ROOT / rel
    if not path.is_file():
        raise PluginError(f"{rel}: no such result file")
    res = json.loads(path.read_text())
    if not res.get("chains") or not res.get("commit"):
        raise PluginError(f"{rel}: no 'chains' or no 'commit' in it (written before the soak recorded them: "
                          "run the soak again)")
    commit = res['commit'][:12] + ('-dirty' if res['commit'].endswith('-dirty') else '')
    lines = [f"`{res['command']}` at `{commit}`: {res['wall_s'] / 60:.1f} min from the first kept "
             f"step to the last, {res['status']}, {res['lost_samples']} samples lost, {res['duplicate_samples']} "
             f"duplicated; {100 * res['effective_ratio']:.1f} % effective ({100 * res['paced_ratio']:.1f} % at "
             "the median's pace). Mean seconds: from the fault until the master heard of the change it made "
             "(**told**), then from that until the old generation stopped stepping, the new one was formed, and "
             "it made its first step; **lost** is the training time lost after the fault.",
             "",
             "| fault | changed the job | told | stopped | formed | first step | lost | how the master heard (count) |",
             "|---|---|---|---|---|---|---|---|"]
    for kind, k in res["chains"].items():
        causes = "; ".join(f"{how} ({n})" for how, n in k["causes"].items()) or "–"
        lines.append(f"| {KIND_NAMES.get(kind, kind)} | {k['changed']} of {k['count']} | {_s(k['told_s'])} | "
                     f"{_s(k['stopped_s'])} | {_s(k['formed_s'])} | {_s(k['first_step_s'])} | {_s(k['lost_s'])} | "
                     f"{causes} |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARK.sub(lambda m: chains_table(m.group(1)), markdown)
