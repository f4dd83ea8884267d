"""Soak analysis and the report writers (JSON, CSV, PNG, tables), driven by the fake runner."""

import csv
import json

import pytest

from tvmopt.bench import report
from tvmopt.bench.clock import SimClock
from tvmopt.bench.closed_loop import measure
from tvmopt.bench.load import generate, parse_sizes
from tvmopt.bench.runner import FakeRunner
from tvmopt.bench.server import BatchPolicy, serve
from tvmopt.bench.soak import soak
from tvmopt.bench.suite import SCHEMA, BenchOptionError, BenchOptions, _ratios


# ------------------------------------------------------------------------------------ soak
def test_soak_flat_rss_and_latency_is_clean():
    clock = SimClock()
    fake = FakeRunner(clock, service_s=lambda b, s=None: 2**-7)  # exact in binary: no rounding
    out = soak(fake, clock, 1, duration_s=10, windows=5, rss_fn=lambda: 100 << 20)
    assert [w["calls"] for w in out["windows"]] == [256] * 5  # 2 s windows of 7.8125 ms calls
    assert out["p50_drift"] == pytest.approx(0) and not out["drifting"]
    assert out["rss_growth"] == 0 and not out["leak_suspected"]


def test_soak_flags_steady_rss_growth_and_latency_drift():
    clock = SimClock()
    # each call is 1% slower than the last window's and leaks 64 KB
    fake = FakeRunner(clock, service_s=lambda b, s=None: 0.010 * (1 + clock.now() / 10))
    rss = [100 << 20]

    def rss_fn():
        rss[0] += (64 << 10) * 200
        return rss[0]

    out = soak(fake, clock, 1, duration_s=60, windows=6, rss_fn=rss_fn)
    assert out["leak_suspected"]
    assert out["rss_slope_bytes_per_min"] > 0
    assert out["drifting"] and out["p50_drift"] > 0.2


def test_soak_ignores_growth_that_stops_after_warm_up():
    clock = SimClock()
    fake = FakeRunner(clock, service_s=lambda b, s=None: 0.010)
    values = iter([100 << 20, 150 << 20] + [150 << 20] * 8)
    out = soak(fake, clock, 1, duration_s=10, windows=10, rss_fn=lambda: next(values))
    assert out["rss_growth"] == pytest.approx(0.5) and not out["leak_suspected"]


# ------------------------------------------------------------------------------------ options
def test_options_reject_bad_values_with_the_choices():
    with pytest.raises(BenchOptionError, match="choose from ort, openvino, openvino-f32, torch, torch.compile"):
        BenchOptions(path="m.onnx", baselines=["tf"])
    with pytest.raises(BenchOptionError, match="poisson or burst"):
        BenchOptions(path="m.onnx", load="closed")
    with pytest.raises(BenchOptionError):
        BenchOptions(path="m.onnx", batches=[0])
    assert BenchOptions(path="m.onnx", load="poisson").duration == 10.0
    assert BenchOptions(path="m.onnx", duration=30).soak == 30  # --duration alone: soak
    assert BenchOptions(path="m.onnx", load="burst", duration=30).soak is None
    with pytest.raises(BenchOptionError):
        BenchOptions(path="m.onnx", soak=-1)


# ------------------------------------------------------------------------------------ writers
@pytest.fixture()
def doc():
    clock = SimClock()
    tvm = FakeRunner.linear(clock, 0.004, 0.001, name="tvmopt")
    ort = FakeRunner.linear(clock, 0.002, 0.002, name="onnxruntime")
    rows = []
    for b in (1, 8):
        rows += [r.to_json() for r in measure([tvm, ort], clock, b, warmup=2, runs=20)]
    _ratios(rows)
    clock = SimClock()
    srv = FakeRunner.linear(clock, 0.004, 0.001)
    reqs = generate("poisson", 1500, 2, parse_sizes("short:0.8,medium:0.2"), seed=0)
    res = serve(srv, clock, reqs, BatchPolicy(max_batch=8, timeout_s=0.05), duration=2)
    return {"schema": SCHEMA, "versions": {}, "host": {"threads": 2, "cpu_count": 2},
            "artifacts": {"any": "x.tvmopt"}, "model": None, "target": "x86-avx2",
            "device": "cpu", "options": {}, "warnings": ["w"], "baselines": {"ort": "ok"},
            "closed_loop": rows,
            "profile": {"batch": 1, "runs": 5, "kernel_count": 3, "total_ms_per_run": 2.0,
                        "other_ms_per_run": 0.5,
                        "kernels": [{"name": "fused_conv", "calls_per_run": 1.0,
                                     "mean_us": 1500.0, "total_ms_per_run": 1.5,
                                     "share": 0.75}]},
            "load": {"kind": "poisson", "rate": 300, "duration_s": 2, "burst": None,
                     "size_dim": "batch items", "sizes": [], "policy": {
                         "max_batch": 8, "max_wait_s": 0.005, "timeout_s": 0.05,
                         "max_queue": 1000},
                     "summary": res.summary(),
                     "timeline": {"arrival_s": res.arrival.tolist(),
                                  "latency_ms": ((res.finish - res.arrival) * 1e3).tolist(),
                                  "status": res.status,
                                  "batches": [list(b) for b in res.batches]}},
            "soak": None,
            "memory": {"rss_start_bytes": 1, "rss_peak_bytes": 2, "rss_lifetime_peak_bytes": 3,
                       "gpu_bytes": None, "gpu_note": "n/a"},
            "cold_start": {"batch": 1, "process_s": 1.0, "import_s": 0.5, "load_s": 0.1,
                           "first_run_s": 0.05, "load_plus_first_run_s": 0.15, "repeats": 1}}


def test_ratios_divide_by_onnxruntime_at_the_same_batch(doc):
    tvm1 = next(r for r in doc["closed_loop"] if r["runner"] == "tvmopt" and r["batch"] == 1)
    tvm8 = next(r for r in doc["closed_loop"] if r["runner"] == "tvmopt" and r["batch"] == 8)
    assert tvm1["ratio_to_ort"]["mean_ms"] == pytest.approx(5 / 4)     # 4+1 ms vs 2+2 ms
    assert tvm8["ratio_to_ort"]["mean_ms"] == pytest.approx(12 / 18)   # 4+8 ms vs 2+16 ms
    assert tvm8["ratio_to_ort"]["throughput"] == pytest.approx(18 / 12)


def test_json_is_strict_and_csv_has_every_closed_loop_figure(doc, tmp_path):
    assert any(s == "timed_out" for s in doc["load"]["timeline"]["status"])  # NaN latencies
    report.write_json(doc, tmp_path / "b.json")
    back = json.loads((tmp_path / "b.json").read_text(),
                      parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert back["schema"] == SCHEMA
    assert None in back["load"]["timeline"]["latency_ms"]
    report.write_csv(doc, tmp_path / "b.csv")
    rows = list(csv.DictReader(open(tmp_path / "b.csv")))
    p99 = [r for r in rows if r["section"] == "closed_loop" and r["metric"] == "p99_ms"]
    assert len(p99) == 4
    assert {r["section"] for r in rows} >= {"closed_loop", "warmup", "load", "load_latency",
                                            "profile", "cold_start", "memory"}


def test_plot_writes_a_png_and_tables_print(doc, tmp_path, capsys):
    report.write_plot(doc, tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report.print_bench(doc)
    out = capsys.readouterr().out
    for text in ("closed-loop latency", "P99.9", "per-kernel profile", "fused_conv",
                 "load test", "batch-size histogram", "cold start", "memory: RSS",
                 "warning: w"):
        assert text in out, text
