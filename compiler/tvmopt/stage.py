"""Where a run is, for the crash supervisor: a native crash leaves no Python to report it.

`enter(stage, detail)` writes the current stage to the file the supervising CLI process named
in TVMOPT_STAGE_FILE (nothing happens without it, so the Python API is unaffected). The parent
reads it when the child dies by a signal and names the stage in its one line. Listeners (the
CLI's progress line) are told of each stage too.
"""

from __future__ import annotations

import os

STAGE_FILE = "TVMOPT_STAGE_FILE"
# Testing hook for the crash isolation: a real SIGSEGV (a null read) when this stage is entered.
DEBUG_CRASH = "TVMOPT_DEBUG_CRASH"


_detail = ""
_listeners: list = []


def listen(fn) -> None:
    """Call `fn(stage, detail)` on every enter() until unlisten(fn)."""
    _listeners.append(fn)


def unlisten(fn) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


def enter(stage: str, detail: str | None = None) -> None:
    """`detail` (the model or artifact) carries over from the last call when not given."""
    global _detail
    if detail is not None:
        _detail = detail
    detail = _detail
    path = os.environ.get(STAGE_FILE)
    if path:
        try:
            with open(path, "w") as f:
                f.write(f"{stage}\t{detail}")
        except OSError:
            pass
    for fn in list(_listeners):
        fn(stage, detail)
    if os.environ.get(DEBUG_CRASH) == stage:
        import ctypes

        ctypes.string_at(0)  # segfaults inside libc, as a crash in TVM's C++ would


def read(path: str) -> tuple[str, str]:
    try:
        with open(path) as f:
            stage, _, detail = f.read().partition("\t")
        return stage or "start-up", detail
    except OSError:
        return "start-up", ""
