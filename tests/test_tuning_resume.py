"""Resumability: a `tvmopt tune` killed mid-run keeps its records and the rerun continues."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import tiny_mlp  # noqa: E402

from tvmopt import tuning  # noqa: E402


@pytest.mark.slow
def test_killed_tuning_resumes(tmp_path):
    model = tiny_mlp(tmp_path / "mlp.onnx")
    db = tmp_path / "db"
    cmd = [sys.executable, "-c", "from tvmopt.cli import main; main()", "tune", model, "--shape", "x=1x32",
           "--db", str(db), "--trials", "64", "--trials-per-round", "4", "--population", "32"]
    log = (tmp_path / "tune.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    records = db / tuning.RECORD_FILE
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if records.exists() and len(records.read_text().splitlines()) >= 4:
                break
            assert proc.poll() is None, f"tune exited early: {(tmp_path / 'tune.log').read_text()[-500:]!r}"
            time.sleep(0.5)
        else:
            pytest.fail("no records written within 240 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: builder/runner workers too
        proc.wait()
        log.close()
    kept = len(records.read_text().splitlines())
    with records.open("a") as f:  # what a kill in the middle of a write leaves behind
        f.write('[0, [[["SampleCategorical", ')
    result = tuning.tune(tuning.TuneOptions(model=model, trials=kept + 4, db=str(db),
                                            shapes={"x": (1, 32)}, trials_per_round=4, population=32))
    assert result.sanitized.bad_record_lines == 1
    assert result.trials_before == kept
    assert result.trials_run == 4 and result.build_failures == 0
    assert len(records.read_text().splitlines()) == kept + 4
    assert tuning.read_manifest(db)["trials"] == kept + 4


@pytest.mark.slow
def test_ctrl_c_keeps_records_and_reports(tmp_path):
    model = tiny_mlp(tmp_path / "mlp.onnx")
    db = tmp_path / "db"
    # A shell's background jobs ignore SIGINT; restore Python's handler as a terminal would.
    boot = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "sys.argv[0] = 'tvmopt'; from tvmopt.cli import main; main()")
    cmd = [sys.executable, "-c", boot, "tune", model, "--shape", "x=1x32", "--db", str(db),
           "--trials", "64", "--trials-per-round", "4", "--population", "32"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    records = db / tuning.RECORD_FILE
    try:
        deadline = time.monotonic() + 240
        while not (records.exists() and len(records.read_text().splitlines()) >= 4):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out[-800:]
    assert "interrupted: records measured so far are kept" in " ".join(out.split())
    assert "Traceback" not in out
    kept = len(records.read_text().splitlines())
    assert kept >= 4 and tuning.read_manifest(db)["trials"] == kept
