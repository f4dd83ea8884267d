"""Every fallback a compile takes, recorded where it happens and collected per compile.

A fallback is a failed attempt that the pipeline survives by doing something plainer: a
schedule rule that raised on a kernel (the next rule, or LLVM's default loop nest, gets it),
a precision or layout rewrite that TVM refused, a post-schedule pass that refused the module, a
kernel library that could not be loaded. Each is correct but slower than what was planned, so
the user must be able to see which ones happened: `record()` is called at the point of failure,
and `collect()` gathers them for one compile (the manifest's `fallbacks`).

A rule that declines a kernel because it is not its kind is not a fallback: only exceptions and
refusals are recorded. Recording is thread-local and costs nothing when nobody collects. This
module imports nothing from tvmopt or TVM, so every package (codegen/, library/, precision/, passes/) can use it.
"""

from __future__ import annotations

import contextlib
import re
import threading
from dataclasses import dataclass

# kind -> what runs instead (the summary's and the log's wording), in pipeline order.
KINDS = {
    "precision_rewrite": "a narrower rewrite is applied",
    "layout_rewrite": "the module keeps its imported layout (NCHW convolutions)",
    "library_unavailable": "default schedules are used for every kernel",
    "schedule_rule": "the next schedule rule takes the kernel (last: LLVM's default loop nest)",
    "post_schedule_pass": "the module continues without the pass",
}


@dataclass(frozen=True)
class Fallback:
    """One fallback.

    Attributes:
        kind: a key of KINDS.
        where: the kernel (schedule_rule), the pass, or the library that failed.
        reason: the error, one line.
        rule: the schedule rule that raised (schedule_rule only).
        instead: what ran instead, when more precise than KINDS says.
    """

    kind: str
    where: str
    reason: str
    rule: str = ""
    instead: str = ""

    def to_json(self) -> dict:
        out = {"kind": self.kind, "where": self.where, "reason": self.reason,
               "instead": self.instead or KINDS[self.kind]}
        if self.rule:
            out["rule"] = self.rule
        return out


_local = threading.local()


def _collectors() -> list[list[Fallback]]:
    if not hasattr(_local, "collectors"):
        _local.collectors = []
    return _local.collectors


@contextlib.contextmanager
def collect():
    """Collect every fallback recorded in this thread inside the block, in order, once each.

    Yields:
        The list the Fallback records are appended to.
    """
    events: list[Fallback] = []
    _collectors().append(events)
    try:
        yield events
    finally:
        _collectors().remove(events)


@contextlib.contextmanager
def paused():
    """Record nothing inside the block: trial builds (timing a kernel both ways) are not the
    artifact's pipeline, and their kernels may not even ship."""
    saved = list(_collectors())
    _collectors().clear()
    try:
        yield
    finally:
        _collectors().extend(saved)


def record(kind: str, where: str, reason, rule: str = "", instead: str = "") -> None:
    """Record a fallback with every active collector.

    Args:
        kind: a key of KINDS.
        where: the kernel, pass or library that failed.
        reason: the exception, or a one-line text.
        rule: the schedule rule that raised (schedule_rule).
        instead: what ran instead, when more precise than KINDS[kind].
    """
    if kind not in KINDS:
        raise ValueError(f"unknown fallback kind '{kind}' (known: {', '.join(KINDS)})")
    event = Fallback(kind, str(where), one_line(reason), rule, instead)
    for events in _collectors():
        # The front half may run twice in one compile (a precision plan re-runs it): once each.
        if event not in events:
            events.append(event)


def one_line(reason) -> str:
    """The last non-empty line of an error (TVM puts the message after its traceback), capped."""
    if isinstance(reason, BaseException):
        lines = [ln for ln in str(reason).strip().splitlines() if ln.strip()]
        text = lines[-1].strip() if lines else type(reason).__name__
    else:
        text = " ".join(str(reason).split())
    return text[:200]


def kernel_name(func) -> str:
    """A PrimFunc's name; dlight passes it without one, so then the names of its blocks."""
    name = func.attrs.get("global_symbol") if getattr(func, "attrs", None) is not None else None
    if name:
        return str(name)
    blocks = re.findall(r'T\.sblock\("(\w+)"\)', func.script())
    return "kernel with blocks " + ",".join(b for b in blocks if b != "root")[:80]


def counts(events) -> dict[str, int]:
    """kind -> number of fallbacks in KINDS order, for the summary (Fallback records or their
    JSON)."""
    kinds = [e["kind"] if isinstance(e, dict) else e.kind for e in events]
    return {k: kinds.count(k) for k in [*KINDS, *sorted(set(kinds) - set(KINDS))] if k in kinds}
