"""No import cycle anywhere in src/edl, function-local imports included.

import-linter's contracts (.importlinter) hold the packages' order; this holds the modules': a
cycle through an import inside a function is still two modules that cannot be read (or moved)
one without the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _modules(src: Path, top: str) -> dict[str, tuple[Path, bool]]:
    """Every module of package ``top`` by its dotted name: its file, and whether it is a package's ``__init__``."""
    out = {}
    for path in sorted((src / top).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def import_graph(src: Path = SRC, top: str = "edl") -> dict[str, dict[str, int]]:
    """Module -> the modules of ``top`` it imports (anywhere in it, inside functions too), each with
    the line of its first import of it.

    ``from edl.x import y`` is an import of ``edl.x.y`` where that is a module, else of ``edl.x``;
    relative imports are resolved against the importing module's package."""
    modules = _modules(src, top)
    graph: dict[str, dict[str, int]] = {}
    for name, (path, package) in modules.items():
        here = name.split(".") if package else name.split(".")[:-1]
        edges = graph.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                if target in modules and target != name:
                    edges.setdefault(target, node.lineno)
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of ``graph`` as the modules along it (the first repeated at the end), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_graph_sees_every_kind_of_import(tmp_path):
    files = {
        "pkg/__init__.py": "from .a import A\n",
        "pkg/a.py": "import os\nA = 1\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "from .. import a\nfrom ..a import A\nfrom . import c\n",
        "pkg/sub/c.py": "def f():\n    import pkg.a\n    from pkg.sub import b\n",
        "pkg/d.py": "from pkg.sub.c import f\nfrom pkg import sub\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, "pkg")
    assert {m: set(e) for m, e in graph.items()} == {
        "pkg": {"pkg.a"}, "pkg.a": set(), "pkg.sub": set(),
        "pkg.sub.b": {"pkg.a", "pkg.sub.c"},  # relative imports, of a module and of a name in one
        "pkg.sub.c": {"pkg.a", "pkg.sub.b"},  # inside a function
        "pkg.d": {"pkg.sub.c", "pkg.sub"},
    }
    assert find_cycle(graph) == ["pkg.sub.c", "pkg.sub.b", "pkg.sub.c"]


def test_a_cycle_is_found_and_named():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"a": 1}}) is None


def test_no_module_of_edl_imports_itself_back():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(
        f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"
