"""A native crash inside a command is one line naming stage, model and signal, not a dead CLI.

The crash is real: TVMOPT_DEBUG_CRASH makes the stage read address 0 in C (a SIGSEGV, as a crash
in TVM's C++ would be); the `tvmopt` entry point runs the command in a child it supervises.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tvmopt.models import default_model_path

TVMOPT = Path(sys.executable).with_name("tvmopt")
pytestmark = pytest.mark.skipif(not TVMOPT.exists(), reason="the tvmopt console script is not installed")


def _run(args, **env):
    return subprocess.run([str(TVMOPT), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


@pytest.mark.parametrize("crash_at", ["import", "the fuse phase", "code generation"])
def test_native_crash_in_compile_is_one_line(tmp_path, crash_at):
    model = str(default_model_path())
    res = _run(["compile", model, "-o", str(tmp_path / "a")], TVMOPT_DEBUG_CRASH=crash_at)
    assert res.returncode == 3
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("tvmopt: error: native crash (SIGSEGV) during " + crash_at)
    assert model in lines[-1] and "TVMOPT_SAVE_TEMPS" in lines[-1]
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "a").exists()  # nothing half-written


def test_save_temps_keeps_the_ir_and_what_crashed(tmp_path):
    temps = tmp_path / "temps"
    # codegen dispatch: no kernel timing builds, whose code generation would crash first
    # whenever the timing cache lacks them (a fresh machine, changed schedules)
    res = _run(["compile", str(default_model_path()), "-o", str(tmp_path / "a"),
                "--dispatch", "codegen"],
               TVMOPT_DEBUG_CRASH="code generation", TVMOPT_SAVE_TEMPS=str(temps))
    assert res.returncode == 3 and str(temps) in res.stderr
    crash = (temps / "crash.txt").read_text()
    assert "stage: code generation" in crash and "signal: SIGSEGV" in crash
    assert any(p.name.endswith("-fuse.py") for p in temps.iterdir())  # the IR up to the crash


def test_a_crash_while_inspecting_names_the_model(tmp_path):
    res = _run(["inspect", str(default_model_path())], TVMOPT_DEBUG_CRASH="inspect")
    assert res.returncode == 3 and "during inspect of" in res.stderr


def test_ordinary_errors_and_exit_codes_pass_through(tmp_path):
    res = _run(["compile", str(tmp_path / "missing.onnx")])
    assert res.returncode == 1 and res.stderr.startswith("tvmopt: error:")
    assert _run(["targets"]).returncode == 0  # light commands run in-process
