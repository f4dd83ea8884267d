"""What tune leaves to oneDNN: each workload's FLOPs, the probe of oneDNN's best rate on the
host, and the calls' time read against it."""

from __future__ import annotations

import pytest

from tests.models import tiny_conv

from tvmopt.precision.choice import Choice
from tvmopt.tuning import library


def test_the_calls_are_read_against_the_probe_at_their_own_precision():
    choices = [Choice("conv", 2, "library", 1.0, 2.0, gflop=0.1),
               Choice("mm", 1, "library", 2.0, 2.0, precision="bf16", library_bf16_ms=0.5,
                      gflop=0.2),
               Choice("cg", 4, "codegen", 1.0, 0.5, gflop=9.0)]  # not oneDNN's: left out
    lib = library.library_time(choices, {"fp32": 100.0, "bf16": 400.0})
    assert lib.ms == pytest.approx(2 * 1.0 + 0.5) and lib.gflop == pytest.approx(0.4)
    assert lib.gflops == pytest.approx(0.4 / 2.5e-3)
    # at the probe: 0.2 GFLOP at 100 GFLOP/s (2 ms) + 0.2 at 400 (0.5 ms), against 2.5 ms run
    assert lib.at_probe_ms == pytest.approx(2.5) and lib.of_probe == pytest.approx(1.0)
    slow = library.library_time([Choice("conv", 1, "library", 8.0, 9.0, gflop=0.2)],
                                {"fp32": 100.0})
    assert slow.of_probe == pytest.approx(0.25)
    # No probe, no rate for a precision, a call of unknown FLOPs: no share, never a guess.
    assert library.library_time(choices).of_probe is None
    assert library.library_time(choices, {"fp32": 100.0}).of_probe is None
    unknown = [*choices, Choice("dyn", 1, "library", 1.0, 1.0)]
    assert library.library_time(unknown, {"fp32": 1.0, "bf16": 1.0}).of_probe is None
    assert library.library_time(unknown).gflops is None
    # An untimed call adds neither time nor FLOPs.
    forced = library.library_time([*choices, Choice("rnn", 3, "library", None, None, gflop=5.0)],
                                  {"fp32": 100.0, "bf16": 400.0})
    assert forced.untimed == 3 and forced.gflop == pytest.approx(0.4)


def test_each_dispatched_workload_carries_its_flops(tmp_path, monkeypatch):
    import onnx
    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.precision import choice
    from tvmopt.timing import Measurement
    from tvmopt.runtime.in_memory import host_target

    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(choice, "measure_call", lambda *a, **k: Measurement(1.0, 1.0, 0.0))
    model = tiny_conv(tmp_path / "conv.onnx", channels=8, size=6)
    cfg = pipeline.PipelineConfig(dispatch="auto", library_compute=("fp32",))
    records = pipeline.optimize(import_onnx(onnx.load(model)).mod, host_target().to_tvm(), cfg,
                      until="dispatch").records
    got = sorted(c.gflop * 1e9 for c in records.choices)
    # 3x3 conv 16 -> 8 channels with bias and relu, then a 1x1 conv 8 -> 8, on 6x6
    conv3 = 2 * 6 * 6 * 8 * 16 * 9 + 2 * 6 * 6 * 8  # multiply-adds, then bias and relu
    conv1 = 2 * 6 * 6 * 8 * 8
    assert got == pytest.approx(sorted([conv3, conv1]), rel=0.01)


def test_the_probe_times_its_matmul_on_every_call(tmp_path, monkeypatch, onednn_extension):
    """Never a cached rate: an earlier run's timing, taken at a busy moment, read oneDNN's
    fp32 rate at half of what it is."""
    from tvmopt.precision import choice
    from tvmopt.timing import Measurement
    from tvmopt.runtime.in_memory import host_target

    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def measure(vm, name, inputs, roof=None):
        calls.append(name)
        return Measurement(2.0, 2.0, 0.0)

    monkeypatch.setattr(choice, "measure_call", measure)
    m, k, n = library.PROBE_SHAPE
    rates = library.probe_rates(host_target(), ("fp32",))
    assert rates == {"fp32": pytest.approx(2 * m * k * n / 2.0 / 1e6)}
    timed = len(calls)
    assert timed and library.probe_rates(host_target(), ("fp32",)) == rates
    assert len(calls) == 2 * timed
    # A probe timed on a busy machine gives no rate (the dispatch did not trust it).
    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "busy"))
    monkeypatch.setattr(choice, "measure_call",
                        lambda *a, **kw: Measurement(2.0, 2.0, foreign_load=1.5))
    assert library.probe_rates(host_target(), ("fp32",)) == {}

