"""What a user's terminal shows: no TVM C++ log lines unless asked, tables within COLUMNS."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvmopt.cli.native_log import NATIVE_LOG_LINE


def _tvmopt(*args, env=None, cwd=None):
    """`python -m tvmopt.cli ARGS` in a fresh process, stderr and stdout apart."""
    return subprocess.run([sys.executable, "-m", "tvmopt.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "TVMOPT_NO_ISOLATION": "1", **(env or {})})


def _native_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if NATIVE_LOG_LINE.match(ln.encode())]


def test_filter_drops_native_log_lines_and_passes_the_rest():
    code = textwrap.dedent("""
        import os, sys
        from tvmopt.cli.native_log import filtered
        with filtered():
            os.write(2, b"[01:02:03] /src/relax/block_builder.cc:65: Warning: BlockBuilder "
                        b"destroyed with remaining blocks!\\n")
            os.write(2, b"cc: a compiler message\\n")
            # a message with newlines: its indented lines go with it, the next line is kept
            os.write(2, b"[01:02:03] /src/apply_custom_rule.cc:64: Warning: Unknown schedule "
                        b"rule. Checked ffi::Functions:\\n  s_tir.meta_schedule.cpu.pool_max\\n"
                        b"\\tanother\\n")
            os.write(2, b"cc: next\\n  an indented line of a message of its own\\n")
            print("python stderr", file=sys.stderr)
        os.write(2, b"[01:02:03] /src/x.cc:1: after the filter\\n")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert "cc: a compiler message" in lines and "python stderr" in lines
    assert not any("pool_max" in ln or "another" in ln for ln in lines), lines
    assert "  an indented line of a message of its own" in lines
    assert _native_lines(res.stderr) == ["[01:02:03] /src/x.cc:1: after the filter"]


def test_compile_stderr_holds_no_native_log_lines_unless_verbose(tmp_path):
    # Gather legalizes to TVM's `take`, whose C++ warns once per kernel on every build
    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 4])], [table])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(tmp_path / "gather.onnx"))
    quiet = _tvmopt("compile", tmp_path / "gather.onnx", "-o", tmp_path / "a.tvmopt")
    assert quiet.returncode == 0, quiet.stderr
    assert _native_lines(quiet.stderr) == [], quiet.stderr
    assert "compiled" in quiet.stdout
    verbose = _tvmopt("-v", "compile", tmp_path / "gather.onnx", "-o", tmp_path / "b.tvmopt")
    assert verbose.returncode == 0, verbose.stderr
    assert _native_lines(verbose.stderr), "the model no longer makes TVM log: pick another"


@pytest.mark.slow  # plans a model with kernel timing, twice
def test_plan_fits_80_columns_and_wide_shows_every_column():
    narrow = _tvmopt("plan", env={"COLUMNS": "80"})
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80, "\n".join(ln for ln in lines if len(ln) > 80)
    assert "--wide shows all" in narrow.stdout and "kernel" in narrow.stdout
    wide = _tvmopt("plan", "--wide", env={"COLUMNS": "80"})
    assert wide.returncode == 0, wide.stderr
    header = next(ln for ln in wide.stdout.splitlines() if "kernel" in ln and "why" in ln)
    assert len(header) > 80 and "bytes" in header


def test_bench_tables_fit_80_columns(capsys):
    from tvmopt import console as cons
    from tvmopt.bench import report

    rows = [{"runner": name, "batch": 8, "size": None,
             "warmup": {"mean_ms": 12.3456},
             "steady": {"n": 50, "min_ms": 1.234, "mean_ms": 12.345, "p50_ms": 12.345,
                        "p90_ms": 123.456, "p95_ms": 123.456, "p99_ms": 1234.567,
                        "p999_ms": 1234.567, "max_ms": 1234.567, "std_ms": 12.34, "cv": 0.123,
                        "throughput": 12345.6, "noisy": True},
             "ratio_to_ort": {"mean_ms": 1.23, "p50_ms": 1.23, "p99_ms": 1.23,
                              "throughput": 0.81}}
            for name in ("tvmopt", "onnxruntime", "torch.compile")]
    doc = {"artifacts": {"any": "x.tvmopt"}, "target": "x86-avx2", "device": "cpu",
           "host": {"threads": 2, "tvm_threads": 2}, "baselines": {"ort": "ok"},
           "closed_loop": rows, "profile": None, "load": None, "soak": None,
           "memory": {"rss_start_bytes": 1, "rss_peak_bytes": 2, "rss_lifetime_peak_bytes": 3,
                      "gpu_bytes": None, "gpu_note": "n/a"}, "cold_start": None, "warnings": []}
    width = cons.console.width
    try:
        cons.console.width = 80
        report.print_bench(doc)
        narrow = capsys.readouterr().out
        cons.set_wide()
        report.print_bench(doc)
        wide = capsys.readouterr().out
    finally:
        cons.set_wide(False)
        cons.console.width = width
    assert max(len(ln) for ln in narrow.splitlines()) <= 80, narrow
    header = next(ln for ln in narrow.splitlines() if "runner" in ln and "P50" in ln)
    assert "P99.9" not in header and "P99" in header
    assert "left out to fit: P99.9" in narrow
    wide_header = next(ln for ln in wide.splitlines() if "runner" in ln and "P50" in ln)
    assert "P99.9" in wide_header and "left out" not in wide
