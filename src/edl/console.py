"""What edl prints for people: text printed as text, one event per line.

Most of what edl prints holds text it does not control: a trainer's last log line, exception
text, pod reasons, paths, job and trainer names. Rich parses ``[...]`` in a plain string as
markup (a Gloo error, ``[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:576] Read error``,
raised ``MarkupError`` and took ``edl train`` down) and ``:name:`` as an emoji code. A ``Text``
is never parsed, so every line and table cell edl prints is built here as one, whatever console
it goes to (the caller's own included); styles come as ``(text, style)`` parts, never as markup.

Only this module imports rich (``.importlinter``): the rest of edl prints, draws tables and shows
progress bars through it. ``Console``, ``Table`` and ``Progress`` below are rich's, named here
for the callers' type hints and for what they call on them (``print``, ``add_column``, ``update``).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from rich.console import Console, JustifyMethod
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskID, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn)
from rich.table import Table
from rich.text import Text

# Libraries that log a line per request at INFO (httpx: every status poll, 277 lines in one `edl demo`).
THIRD_PARTY_LOGGERS = ("httpx", "httpcore", "urllib3", "kubernetes", "minio", "uvicorn.error", "uvicorn.access")
VERBOSE_ENV = "EDL_VERBOSE"  # "1": keep them (`edl --verbose` sets it, for the processes it starts too)

Part = str | tuple[str, str]  # plain text, or text and its rich style ("bold", "green")


CLIP = 500  # characters of someone else's line kept in one of ours (a trainer's last line, a pod's reason)


def clip(line: str, limit: int = CLIP) -> str:
    """``line`` whole, or cut to ``limit`` characters with an ellipsis: one line stays one line."""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def text(*parts: Part) -> Text:
    """The parts as one ``Text``, each verbatim."""
    return Text.assemble(*parts)


def say(console: Console, *parts: Part) -> None:
    """Print one line: the parts verbatim, never wrapped (a log read by a program keeps one event per line)."""
    console.print(text(*parts), soft_wrap=True)


def add_row(table: Table, *cells: str) -> None:
    """A table row whose cells are shown verbatim."""
    table.add_row(*(Text(c) for c in cells))


def plain_console(**kwargs) -> Console:
    """edl's own console: nothing that reaches it as a string is read as markup or emoji codes either."""
    return Console(markup=False, emoji=False, **kwargs)


def table(*columns: str | tuple[str, JustifyMethod], title: str | Text | None = None, caption: str | None = None) -> Table:
    """A table with these columns (a header, or a header and its justification: ``("JCT s", "right")``);
    its rows go in with ``add_row`` here (cells verbatim), and the console's ``print`` shows it."""
    t = Table(title=title, caption=caption)
    for c in columns:
        left: JustifyMethod = "left"
        header, justify = (c, left) if isinstance(c, str) else c
        t.add_column(header, justify=justify)
    return t


Bar = TaskID  # one bar of ``progress_bars``: what its ``add_task`` answers and its ``update`` takes


def progress_bars(console: Console, *, done: str = "count", info: bool = False, **options: Any) -> Progress:
    """Progress bars on ``console``, drawn on a terminal only (disabled elsewhere): each bar's description
    (verbatim), the bar, how far it is (``done``: ``"count"``, done of total, or ``"percent"``), its
    ``info`` field (verbatim; where ``info``) and the time elapsed. ``options`` go to rich's ``Progress``."""
    columns: list[Any] = [TextColumn("{task.description}", markup=False), BarColumn(),
                          MofNCompleteColumn() if done == "count" else TaskProgressColumn(),
                          *([TextColumn("{task.fields[info]}", markup=False)] if info else []),
                          TimeElapsedColumn()]
    return Progress(*columns, console=console, disable=not console.is_terminal, **options)


def configure_logging() -> None:
    """edl's logging, in every edl process (and a pipeline step's): ``EDL_LOG_LEVEL`` (default INFO) to
    stderr, the third-party request logs at WARNING unless ``EDL_VERBOSE=1``."""
    logging.basicConfig(level=os.environ.get("EDL_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    quiet_third_party_logs()


def quiet_third_party_logs() -> None:
    """Third-party loggers at WARNING (a process whose logging someone else set up, a KFP executor)."""
    if os.environ.get(VERBOSE_ENV) == "1":
        return
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
