"""No broad `except` in tvmopt swallows an error unseen.

A handler that catches everything (bare `except`, `except Exception`, `except BaseException`)
must re-raise, record the fallback it takes (tvmopt.fallbacks.record) or log the reason (a
warning). A handler whose exception is the answer to a question (`int(x)` failing: not an int)
names the exception types that mean that answer, so it is no broad handler and this scan passes
it; every other error then propagates. The few broad handlers that must stay as they are are
listed in ALLOWED with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "compiler" / "tvmopt"

_BROAD = {"Exception", "BaseException"}

# (path under compiler/tvmopt, innermost enclosing function) -> why the handler stays broad.
ALLOWED = {
    ("bench/isolated.py", "_serve"):
        "a worker process: the error is sent to the parent, which reports it",
    ("bench/generate.py", "_serve_generate"):
        "a generation worker process: the error is sent to the parent, which names the runtime",
    ("bench/runner.py", "_serve_runner"):
        "a baseline's worker process: the error is sent to the harness as 'unavailable'",
    ("frontend/onnx_ops/preprocess.py", "_evaluate"):
        "onnx.reference raises any type on operands it refuses; the node stays for TVM",
    ("frontend/torch_program.py", "_flops"):
        "fake tensors raise any type on an op they lack; the reason is in the FLOPs note",
    ("tuning/seed.py", "seed_defaults"):
        "the reason is the Seed's error, which the tuning report prints",
    ("tuning/tune.py", "_design_space_error"):
        "the error line is the answer: the tune report prints it per task",
}


def _is_broad(handler: ast.ExceptHandler) -> bool:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    for t in types:
        if t is None:
            return True
        name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
        if name in _BROAD:
            return True
    return False


def _imports_record(tree: ast.Module) -> bool:
    """Whether the module imports `record` itself from tvmopt.fallbacks."""
    return any(isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[-1] == "fallbacks"
               and any(a.name == "record" and a.asname is None for a in n.names)
               for n in ast.walk(tree))


def _accounts_for_it(handler: ast.ExceptHandler, bare_record: bool) -> bool:
    """A `raise`, a fallbacks.record(...) call or a logged warning anywhere in the handler."""
    for node in (n for stmt in handler.body for n in ast.walk(stmt)):
        if isinstance(node, ast.Raise):
            return True
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute):
            if f.attr == "record" and isinstance(f.value, ast.Name) and f.value.id == "fallbacks":
                return True
            if f.attr == "warning" or (f.attr == "warn" and isinstance(f.value, ast.Name)
                                       and f.value.id == "warnings"):
                return True
        elif isinstance(f, ast.Name) and f.id == "record" and bare_record:
            return True
    return False


def scan(source: str, path: str, allowed=None) -> list[str]:
    """'path:line (in function)' of every broad handler in `source` that swallows its error
    and is not allowed.

    Args:
        source: a Python module's text.
        path: its path under compiler/tvmopt ('tuning/seed.py'), as ALLOWED names it.
        allowed: (path, function) pairs let through; ALLOWED when None.
    """
    allowed = ALLOWED if allowed is None else allowed
    tree = ast.parse(source, filename=path)
    bare_record = _imports_record(tree)
    found = []

    def visit(node, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if (isinstance(child, ast.ExceptHandler) and _is_broad(child)
                    and not _accounts_for_it(child, bare_record)
                    and (path, function) not in allowed):
                found.append(f"{path}:{child.lineno} (in {function})")
            visit(child, function)

    visit(tree, "<module>")
    return found


def test_no_broad_handler_swallows_its_error():
    found = []
    for p in sorted(PACKAGE.rglob("*.py")):
        found += scan(p.read_text(), p.relative_to(PACKAGE).as_posix())
    assert not found, (
        "broad except handlers that neither re-raise, record a fallback (fallbacks.record) nor "
        "log a warning; narrow them to the exceptions that mean the answer, record or log, or "
        "add them to ALLOWED with the reason:\n  " + "\n  ".join(found))


def test_every_allowed_handler_still_exists():
    """An ALLOWED entry outlives its handler only by mistake: it would excuse the next one."""
    stale = []
    for path, function in sorted(ALLOWED):
        p = PACKAGE / path
        found = scan(p.read_text(), path, allowed=set()) if p.exists() else []
        if not any(f.endswith(f"(in {function})") for f in found):
            stale.append((path, function))
    assert not stale, f"ALLOWED entries with no broad swallowing handler left: {stale}"


def test_the_scan_reports_a_swallowing_handler():
    assert scan("try: x()\nexcept Exception:\n    pass", "m.py") == ["m.py:2 (in <module>)"]
    source = "def f():\n    try: x()\n    except Exception:\n        pass\n"
    assert scan(source, "somewhere.py") == ["somewhere.py:3 (in f)"]
    assert scan("try: x()\nexcept:\n    pass\n", "m.py") == ["m.py:2 (in <module>)"]
    assert scan("try: x()\nexcept (ValueError, BaseException):\n    y = 1\n", "m.py") == \
        ["m.py:2 (in <module>)"]


def test_the_scan_passes_what_accounts_for_the_error():
    ok = [
        "try: x()\nexcept Exception:\n    cleanup()\n    raise\n",
        "try: x()\nexcept Exception as e:\n    raise ValueError('no') from e\n",
        "try: x()\nexcept Exception as e:\n    fallbacks.record('schedule_rule', 'k', e)\n",
        "from ..fallbacks import record\ntry: x()\nexcept Exception as e:\n    record('a', 'b', e)\n",
        "try: x()\nexcept Exception as e:\n    warnings.warn(str(e))\n",
        "try: x()\nexcept Exception as e:\n    log.warning('%s', e)\n",
        "try: int(s)\nexcept ValueError:\n    pass\n",  # narrow: the exception is the answer
    ]
    for source in ok:
        assert scan(source, "m.py") == [], source
    # `record` that is not tvmopt.fallbacks' own does not count
    assert scan("try: x()\nexcept Exception as e:\n    record(e)\n", "m.py") == \
        ["m.py:2 (in <module>)"]
