"""The elastic-train step's timeline: trainers training, desired by the sidecar and the capacity left,
with the training loss, as a PNG embedded in a self-contained HTML page (the step's ``timeline``
artifact, which the KFP UI renders; ``edl demo`` writes the PNG beside it).
"""

from __future__ import annotations

import base64
import re
from pathlib import Path


def plot_timeline(points: list[dict], title: str, reasons: list[dict] | None = None) -> bytes:
    """The timeline as a PNG: trainers training, desired by the sidecar and the capacity left; the loss.
    ``reasons`` (the summary's ``size_reasons``): each change of why the job is at its size, marked where it
    happened (on the job's clock, which starts with its master, about a second after the points')."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [x["t"] for x in points]
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    a.step(t, [x["world_size"] for x in points], where="post", label="trainers training")
    a.step(t, [x["desired"] for x in points], where="post", linestyle="--", label="desired (sidecar)")
    if any(x.get("free_slots") is not None for x in points):
        a.step(t, [x.get("free_slots") for x in points], where="post", color="grey", alpha=0.6,
               label="capacity left by other tenants")
    top = max([x["desired"] for x in points] + [x["world_size"] for x in points] + [1])
    for r in reasons or []:
        a.axvline(r["t"], color="tab:purple", alpha=0.4, linewidth=1)
        a.annotate(r["cause"].replace("_", " "), (r["t"], top), rotation=90, fontsize=7, color="tab:purple",
                   va="top", ha="right")
    a.set_ylabel("trainers")
    a.legend(loc="lower right")  # the reasons are marked along the top
    losses = [(x["t"], x["loss"]) for x in points if x.get("loss") is not None]
    if losses:
        b.plot([u for u, _ in losses], [v for _, v in losses], color="tab:red")
    b.set_ylabel("training loss")
    b.set_xlabel("seconds since start")
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=90, format="png")
    plt.close(fig)
    return buf.getvalue()


_PNG_SRC = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def write_timeline(points: list[dict], summary: dict, path: Path, title: str) -> None:
    """The step's HTML artifact (the KFP UI renders it): the plot embedded as a base64 PNG (locally,
    where the step follows the job's status; a cluster run has no per-second trace) and the job's
    generations as a table. Self-contained: one file, no external resource."""
    from html import escape

    rows = "".join(
        f"<tr><td>{g.get('id')}</td><td>{g.get('world_size')}</td><td>{escape(str(g.get('reason', '')))}</td>"
        f"<td>{'-' if g.get('pause_s') is None else format(g['pause_s'], '.2f')}</td></tr>"
        for g in summary.get("generations") or [])
    reasons = summary.get("size_reasons") or []
    png = plot_timeline(points, title, reasons) if points else b""
    plot = (f'<img alt="timeline" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
            if points else "<p>No per-second timeline: the step follows the job's status only when it runs locally.</p>")
    why = "".join(f"<tr><td>{r.get('t', 0):.0f}</td><td>{escape(str(r.get('cause', '')))}</td>"
                  f"<td>{escape(str(r.get('text', '')))}</td></tr>" for r in reasons)
    why = (f"<h4>Why this size</h4><table border=\"1\" cellpadding=\"4\"><tr><th>at (s)</th><th>cause</th>"
           f"<th>reason</th></tr>{why}</table>") if why else ""
    page = (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{escape(title)}</title></head><body>"
            f"<h3>{escape(title)}</h3>{plot}<h4>Generations</h4><table border=\"1\" cellpadding=\"4\">"
            f"<tr><th>generation</th><th>trainers</th><th>reason</th><th>pause (s)</th></tr>{rows}</table>{why}"
            f"<p>{escape(str(summary.get('status', '')))}: {summary.get('epochs_completed', 0)} epochs, "
            f"{summary.get('steps', 0)} steps</p></body></html>\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)  # exactly this path: a KFP artifact has no suffix


def embedded_png(page: str) -> bytes | None:
    """The PNG a timeline page embeds, or ``None``."""
    found = _PNG_SRC.search(page)
    return base64.b64decode(found[1]) if found else None
