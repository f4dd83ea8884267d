"""The `tvmopt` entry point: heavy commands run in a child process, so a native crash in TVM
(a segfault or abort in C++, which no Python handler sees) becomes one line naming the stage,
the model and the signal, and a non-zero exit, instead of a dead CLI with no message.

The child is `python -m tvmopt.cli` with the same arguments and stdio; the Python API and
`tvmopt.cli.main` (what tests drive) stay in-process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# Commands that import, build, tune or load native code.
ISOLATED = {"compile", "tune", "inspect", "plan", "bench", "run", "demo", "compare"}
IN_CHILD = "TVMOPT_IN_CHILD"
CRASH_EXIT = 3


def _command(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def run() -> None:
    from .main import main

    argv = sys.argv[1:]
    if os.environ.get(IN_CHILD) or _command(argv) not in ISOLATED or \
            os.environ.get("TVMOPT_NO_ISOLATION"):
        main(prog_name="tvmopt")
        return
    from .. import stage

    fd, stage_file = tempfile.mkstemp(prefix="tvmopt-stage-")
    os.close(fd)
    env = dict(os.environ, **{IN_CHILD: "1", stage.STAGE_FILE: stage_file})
    # Ctrl-C reaches the child from the terminal (tune keeps its records and exits 130);
    # the parent only waits for it. SIGTERM is passed on.
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    proc = subprocess.Popen([sys.executable, "-m", "tvmopt.cli", *argv], env=env)
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGINT, old_int)
        where, detail = stage.read(stage_file)
        os.unlink(stage_file)
    if rc >= 0:
        sys.exit(rc)
    sig = _signal_name(-rc)
    what = f" of {detail}" if detail else ""
    keep = os.environ.get("TVMOPT_SAVE_TEMPS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / "crash.txt").write_text(
            f"command: tvmopt {' '.join(argv)}\nstage: {where}\nsubject: {detail}\n"
            f"signal: {sig}\npython: {sys.version.split()[0]}\n")
        hint = f"the IR up to the crash and crash.txt are in {keep}"
    else:
        hint = "rerun with TVMOPT_SAVE_TEMPS=DIR to keep the IR of each phase up to the crash"
    print(f"tvmopt: error: native crash ({sig}) during {where}{what}; nothing was written; "
          f"{hint}", file=sys.stderr)
    sys.exit(CRASH_EXIT)
