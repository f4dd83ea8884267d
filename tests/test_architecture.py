"""The package's import graph: no cycles, and CLI command modules stay independent."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG_DIR = Path(__file__).resolve().parents[1] / "compiler" / "tvmopt"
PKG = "tvmopt"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG_DIR.rglob("*.py"):
        parts = list(path.relative_to(PKG_DIR).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([PKG, *parts])] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every tvmopt module `name` imports, at module level or inside functions."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import sub` imports the submodule when there is one
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in MODULES and t != name:
                found.add(t)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_import_graph_is_read():
    assert "tvmopt.pipeline" in GRAPH["tvmopt.interface.compile"]
    assert "tvmopt.frontend.model_file" in GRAPH["tvmopt.interface.compile"]  # a function-level import


def test_no_import_cycles():
    cycle = _find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_can_fail():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith(f"{PKG}.cli.")))
def test_cli_commands_import_no_sibling_command(name):
    allowed = {f"{PKG}.cli", f"{PKG}.cli.options", f"{PKG}.cli.main"}
    if name == f"{PKG}.cli.main":
        return  # the group: it registers every command module
    siblings = {m for m in GRAPH[name] if m.startswith(f"{PKG}.cli")} - allowed
    assert not siblings, f"{name} imports {sorted(siblings)}"


def test_library_never_imports_the_cli():
    for name, deps in GRAPH.items():
        if not name.startswith(f"{PKG}.cli"):
            assert not any(d.startswith(f"{PKG}.cli") for d in deps), name
