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


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from X import ...` in `package` names (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(name: str, path: Path) -> set[str]:
    """Every tvmopt module `name` imports, at module level or inside functions."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = _from_module(node, package)
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


# ------------------------------------------------------------------------ folders and layers
# The rooms of the package, lowest first. A room imports only from rooms below it (and from
# itself): the pipeline reads top to bottom, and a folder can be read without the ones above.
# A new folder or top-level module must be placed here.
LAYERS = [
    {"_data", "errors", "files", "fallbacks", "stage", "console", "tensor_info", "models",
     "__init__"},  # the ground floor: no TVM, no pipeline
    {"timing", "targets"},  # measuring on this host; the hardware data
    {"frontend"},  # model files -> Relax
    {"passes"},  # Relax rewrites, and the readers of Relax values they share
    {"codegen"},  # default schedules and the layout they rely on
    {"library"},  # kernel libraries (oneDNN): what they take, how to call them
    {"precision"},  # schemes offer, the timed choice measures, the plan prices
    {"pipeline"},  # the phases, per device
    {"front", "runtime"},  # the front half as compile and tune share it; loading artifacts
    {"tuning"},
    {"interface"},  # compile / plan / tune as the user calls them
    {"bench", "edge"},
    {"compare"},
    {"report"},  # what the CLI prints of a result
    {"cli"},
]


def room(module: str) -> str:
    """The folder (or top-level module) directly under tvmopt that `module` lives in."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    """Every import of a room from a room at its own level or above: 'a -> b' lines."""
    level = {r: i for i, rooms in enumerate(layers) for r in rooms}
    bad = []
    for name, deps in sorted(graph.items()):
        for dep in sorted(deps):
            a, b = room(name), room(dep)
            if a != b and level[b] >= level[a]:
                bad.append(f"{name} ({a}) -> {dep} ({b})")
    return bad


def test_every_room_has_a_layer():
    placed = set().union(*LAYERS)
    assert {room(m) for m in MODULES} <= placed, sorted({room(m) for m in MODULES} - placed)


def test_rooms_import_only_downward():
    bad = upward_imports(GRAPH, LAYERS)
    assert not bad, "imports up or sideways:\n" + "\n".join(bad)


def test_no_folder_cycles():
    folders: dict[str, set[str]] = {}
    for name, deps in GRAPH.items():
        folders.setdefault(room(name), set()).update(room(d) for d in deps if room(d) != room(name))
    cycle = _find_cycle(folders)
    assert cycle is None, "folder cycle: " + " -> ".join(cycle)


def test_the_layer_check_can_fail():
    graph = {"tvmopt.passes.a": {"tvmopt.library.onednn.b"}, "tvmopt.library.onednn.b": set()}
    assert upward_imports(graph, [{"passes"}, {"library"}]) == [
        "tvmopt.passes.a (passes) -> tvmopt.library.onednn.b (library)"]
    assert upward_imports(graph, [{"library"}, {"passes"}]) == []


# ------------------------------------------------------------------------ private names
def private_uses(modules: dict[str, Path]) -> list[str]:
    """Private names (`_x`) of tvmopt modules used from another room: imported by name, or
    read as an attribute of an imported module."""
    bad = []
    for name, path in sorted(modules.items()):
        is_pkg = path.name == "__init__.py"
        package = name if is_pkg else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}  # local name -> tvmopt module it stands for
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            mod = _from_module(node, package)
            if not mod.startswith(PKG):
                continue
            for a in node.names:
                full = f"{mod}.{a.name}"
                if full in modules:
                    aliases[a.asname or a.name] = full
                elif (a.name.startswith("_") and not a.name.startswith("__")
                      and room(mod) != room(name)):
                    bad.append(f"{name} imports {a.name} from {mod}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and room(aliases[node.value.id]) != room(name)):
                bad.append(f"{name} reads {aliases[node.value.id]}.{node.attr}")
    return sorted(set(bad))


def test_no_private_names_across_rooms():
    bad = private_uses(MODULES)
    assert not bad, "\n".join(bad)


def test_the_private_name_check_can_fail(tmp_path):
    (tmp_path / "a.py").write_text("from tvmopt.codegen.layout import _hidden\n")
    (tmp_path / "b.py").write_text("from tvmopt.codegen import layout\nlayout._hidden()\n")
    (tmp_path / "c.py").write_text("from tvmopt.codegen.layout import public\n")
    fake = {"tvmopt.codegen.layout": PKG_DIR / "codegen" / "layout.py",
            "tvmopt.passes.a": tmp_path / "a.py", "tvmopt.passes.b": tmp_path / "b.py",
            "tvmopt.passes.c": tmp_path / "c.py"}
    assert private_uses(fake) == ["tvmopt.passes.a imports _hidden from tvmopt.codegen.layout",
                                  "tvmopt.passes.b reads tvmopt.codegen.layout._hidden"]
