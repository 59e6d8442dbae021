"""MkDocs hook: the reference pages, generated from the code at build time so that they cannot drift.

- ``reference/cli.md``: every ``edl`` command's ``--help``, from ``edl.cli.build_parser``.
- ``reference/component.md``: the pipeline components' parameters, from ``edl.pipeline.components``.
- ``changelog.md``: the repository's ``CHANGELOG.md``.
"""

from __future__ import annotations

import argparse
import inspect
import os
import textwrap
import typing
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
HELP_WIDTH = "100"  # argparse wraps to $COLUMNS: fixed, so the page does not depend on the terminal


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) for the parser and every subcommand below it, depth first."""
    yield path, parser
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def cli_page() -> str:
    from edl.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        parts = ["# Command reference", "",
                 "Every `edl` command's `--help`, as the installed version prints it.", ""]
        for words, parser in _commands(build_parser()):
            title = " ".join(("edl", *words))
            parts += [f"## `{title}`", "", "```text", parser.format_help().rstrip(), "```", ""]
        return "\n".join(parts)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _kind(annotation) -> str:
    """A component parameter's type as KFP sees it: a plain type, or an input/output artifact."""
    if typing.get_origin(annotation) is typing.Annotated:
        artifact, marker = typing.get_args(annotation)[:2]
        direction = "output" if "Output" in getattr(marker, "__name__", str(marker)) else "input"
        return f"{direction} artifact `{artifact.__name__}`"
    return f"`{getattr(annotation, '__name__', str(annotation))}`"


def _default(p: inspect.Parameter) -> str:
    if p.default is inspect.Parameter.empty:
        return "required"
    return f"`{p.default!r}`" if p.default != "" else "`''`"


def component_page() -> str:
    import edl.pipeline.components as components

    parts = ["# Component reference", "",
             "The KFP components in `edl.pipeline.components` (`components/*/*.yaml` are compiled from them), "
             "with each parameter's type and default.", ""]
    for name, obj in vars(components).items():
        func = getattr(obj, "python_func", None)
        if func is None or func.__module__ != components.__name__:
            continue
        parts += [f"## `{name}`", "", textwrap.dedent(func.__doc__ or "").strip(), "",
                  "| parameter | type | default |", "|---|---|---|"]
        for p in inspect.signature(func).parameters.values():
            parts.append(f"| `{p.name}` | {_kind(p.annotation)} | {_default(p)} |")
        parts.append("")
    return "\n".join(parts)


def on_files(files: Files, config) -> Files:
    for uri, content in (("reference/cli.md", cli_page()), ("reference/component.md", component_page()),
                         ("changelog.md", (ROOT / "CHANGELOG.md").read_text())):
        files.append(File.generated(config, uri, content=content))
    return files
