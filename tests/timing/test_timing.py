"""timing: a measurement taken on a busy or noisy machine is re-timed, and if it stays
untrusted it is used but never cached; --retime ignores the cache."""

from __future__ import annotations

import json

import pytest

from tests.onednn_required import require_onednn
from tvmopt import timing
from tvmopt.timing import Measurement, TimingCache


def test_trust_needs_a_quiet_machine_and_close_samples():
    assert Measurement(1.0, 1.1, 0.0).trusted
    assert not Measurement(1.0, 1.1, 0.9).trusted  # another process used most of a core
    assert "0.90 cores" in Measurement(1.0, 1.1, 0.9).why_untrusted()
    assert not Measurement(1.0, 2.0, 0.0).trusted  # median twice the best sample
    assert "spread" in Measurement(1.0, 2.0, 0.0).why_untrusted()


def test_an_untrusted_measurement_is_retimed_and_the_best_trusted_one_kept(monkeypatch):
    samples = iter([(1.0, 3.0, 0.0), (2.0, 2.1, 0.0)])  # noisy, then a trusted one
    monkeypatch.setattr(timing, "_sample", lambda f, inputs: next(samples))
    m = timing.measure_call({"k": None}, "k", [])
    assert (m.ms, m.trusted, m.attempts) == (2.0, True, 2)


def test_a_measurement_that_stays_untrusted_says_so(monkeypatch):
    monkeypatch.setattr(timing, "_sample", lambda f, inputs: (1.0, 1.0, 1.5))
    m = timing.measure_call({"k": None}, "k", [])
    assert not m.trusted and m.attempts == timing.RETRIES + 1


def test_foreign_load_is_measured_from_other_processes_cpu_time(monkeypatch):
    clock = iter([(10.0, 1.0), (12.0, 1.0)])  # 2 s of other processes' CPU, none of ours
    monkeypatch.setattr(timing, "_busy_seconds", lambda children=False: next(clock))
    _, _, foreign = timing._sample(lambda: None, [])
    assert foreign > 1.0  # two CPU seconds over a sub-second wall time


def test_retime_ignores_the_cache_but_saves_the_new_timings(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"k": {"kernel": "w", "library_ms": 1.0, "codegen_ms": 2.0}}))
    assert TimingCache(path).get("k") == (1.0, 2.0)
    fresh = TimingCache(path, read=False)
    assert fresh.get("k") is None
    fresh.put("k", "w", library_ms=3.0, codegen_ms=4.0)
    fresh.save()
    assert TimingCache(path).get("k") == (3.0, 4.0)


def test_untrusted_kernel_timings_are_not_cached_and_compile_says_so(tmp_path, monkeypatch):
    require_onednn()
    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.precision import choice
    from tvmopt.runtime.in_memory import host_target

    from ..library.test_onednn import _small_cnn

    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))
    busy = Measurement(1.0, 1.0, 1.7, timing.RETRIES + 1)
    monkeypatch.setattr(choice, "measure_call", lambda vm, name, inputs, roof=None: busy)
    import onnx

    mod = import_onnx(onnx.load(_small_cnn(tmp_path / "cnn.onnx"))).mod
    cfg = pipeline.PipelineConfig(dispatch="auto")
    records = pipeline.optimize(mod, host_target().to_tvm(), cfg, until="dispatch").records
    assert records.choices and not any(c.trusted for c in records.choices)
    assert all("1.70 cores" in c.note for c in records.choices)
    assert any("not cached" in n for n in records.notes)
    saved = tmp_path / "cache" / timing.CACHE_NAME
    assert not saved.exists() or json.loads(saved.read_text()) == {}


def test_a_kernels_sides_are_retimed_in_turn_while_one_was_timed_under_load(monkeypatch):
    """One side's timing hit by a burst of load (untrusted) sends every side of the kernel
    round again, in the other order, and each keeps its best trusted round: the burst cannot
    decide library against codegen on its own."""
    from tvmopt.precision import choice
    from tvmopt import timing

    calls = []
    script = {("lib", 0): timing.Measurement(50.0, 60.0, 1.2),  # a loaded sample
              ("cg", 0): timing.Measurement(2.0, 2.0, 0.0),
              ("cg", 1): timing.Measurement(2.1, 2.1, 0.0),
              ("lib", 1): timing.Measurement(1.0, 1.0, 0.0)}

    def measure(vm, name, inputs, roof=None):
        n = sum(1 for c in calls if c == vm)
        calls.append(vm)
        return script[(vm, n)]

    monkeypatch.setattr(choice, "measure_call", measure)
    best = choice._time_sides({"lib": ("lib", [], None), "cg": ("cg", [], None)}, "k")
    assert calls == ["lib", "cg", "cg", "lib"]
    assert best["lib"].ms == 1.0 and best["lib"].trusted
    assert best["cg"].ms == 2.0


def test_trusted_sides_are_timed_once(monkeypatch):
    from tvmopt.precision import choice
    from tvmopt import timing

    calls = []
    monkeypatch.setattr(choice, "measure_call", lambda vm, name, inputs, roof=None: (
        calls.append(vm), timing.Measurement(1.0, 1.0, 0.0))[1])
    choice._time_sides({"a": ("a", [], None), "b": ("b", [], None), "c": ("c", [], None)}, "k")
    assert calls == ["a", "b", "c"]


def test_an_untrusted_timing_keeps_the_library_call(tmp_path, monkeypatch):
    """Codegen that timed faster only on a loaded machine does not take a kernel from the
    library: the library call is what runs wherever the kernel lands in the model."""
    from tvmopt.interface.compile import CompileOptions, compile_model
    from tvmopt.precision import choice
    from tvmopt import timing

    require_onednn()
    from ..library.test_onednn import _small_cnn

    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))
    # every sample under load; per kernel two rounds: library, codegen, then codegen, library
    from itertools import cycle

    ms = cycle([3.0, 1.0, 1.0, 3.0])

    def measure(vm, name, inputs, roof=None):
        v = next(ms)
        return timing.Measurement(v, v, 1.5)

    monkeypatch.setattr(choice, "measure_call", measure)
    res = compile_model(CompileOptions(model=_small_cnn(tmp_path / "cnn.onnx"),
                                       output=str(tmp_path / "a"), target="host",
                                       dispatch="auto", precision="fp32"), log=lambda s: None)
    choices = res.artifact.manifest["kernels"]["choices"]
    assert choices and all(not c["trusted"] for c in choices)
    assert all(c["choice"] == "library" and "not trusted" in c["reason"] for c in choices)


def test_a_time_under_the_roofline_floor_is_not_trusted(monkeypatch):
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    # 1 GFLOP on two cores of 100 GFLOP/s each, turbo allowed: at least 1/(2*100*TURBO) s
    r = timing.roof(1e9, 0.0, 100.0, 300.0, library=False)
    assert r.floor_ms == pytest.approx(1e3 / (2 * 100 * timing.TURBO))
    assert r.ceiling_ms is None
    assert Measurement(r.floor_ms * 1.5, r.floor_ms * 1.5, 0.0, roof=r).trusted
    fast = Measurement(r.floor_ms / 3, r.floor_ms / 3, 0.0, roof=r)
    assert not fast.trusted and "under the roofline floor" in fast.why_untrusted()


def test_a_library_time_far_over_its_roofline_is_retimed_then_not_trusted(monkeypatch):
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    r = timing.roof(1e9, 4e6, 100.0, 300.0, library=True)
    slow = r.ceiling_ms * 2
    assert r.ceiling_ms == pytest.approx(timing.CEILING_FLOORS * r.floor_ms
                                         + timing.CEILING_FIXED_MS)
    samples = iter([(slow, slow, 0.0), (r.floor_ms * 2, r.floor_ms * 2, 0.0)])
    monkeypatch.setattr(timing, "_sample", lambda f, inputs: next(samples))
    m = timing.measure_call({"k": None}, "k", [], r)
    assert (m.attempts, m.trusted) == (2, True)  # the burst was re-timed away
    monkeypatch.setattr(timing, "_sample", lambda f, inputs: (slow, slow, 0.0))
    m = timing.measure_call({"k": None}, "k", [], r)
    assert not m.trusted and "roofline floor" in m.why_untrusted()


def test_no_roof_without_the_hosts_peak_or_the_kernels_flops():
    assert timing.roof(1e9, 1e6, None, 300.0, library=True) is None
    assert timing.roof(0.0, 1e6, 100.0, 300.0, library=True) is None


def test_dispatch_gives_each_side_the_roof_of_its_precision(tmp_path, monkeypatch):
    """The library sides get a floor at their precision's peak and a ceiling; the codegen side
    only a floor (an untuned loop nest may be far from peak); the roof's FLOPs are the
    kernel's."""
    require_onednn()
    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.precision import choice
    from tvmopt.runtime.in_memory import host_target

    from ..library.test_onednn import _small_cnn

    peaks, _ = choice._host_figures()
    if "fp32" not in peaks:
        pytest.skip(f"this host's CPU ({timing.host_id() or 'model unknown'}) has no fp32 peak "
                    "in its target entry: no roofline to give the sides")
    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    seen = []

    def measure(vm, name, inputs, roof=None):
        seen.append(roof)
        return Measurement(1.0, 1.0, 0.0)

    monkeypatch.setattr(choice, "measure_call", measure)
    import onnx

    mod = import_onnx(onnx.load(_small_cnn(tmp_path / "cnn.onnx"))).mod
    cfg = pipeline.PipelineConfig(dispatch="auto", library_compute=("fp32",))
    records = pipeline.optimize(mod, host_target().to_tvm(), cfg, until="dispatch").records
    assert records.choices and len(seen) == 2 * len(records.choices)
    lib, cg = seen[0::2], seen[1::2]  # per kernel: library (fp32), then codegen
    assert all(r is not None and r.ceiling_ms > r.floor_ms > 0 for r in lib)
    assert all(r is not None and r.ceiling_ms is None for r in cg)
    assert [r.floor_ms for r in lib] == [r.floor_ms for r in cg]  # same FLOPs, same peak
    # the floor is the kernel's FLOPs at one core's peak (threads=1), turbo allowed
    flops = [r.floor_ms * 1e-3 * peaks["fp32"] * 1e9 * timing.TURBO for r in lib]
    conv3x3 = 2 * 8 * 8 * 9 * 16 * 16  # the model's 3x3 convolutions, multiply-adds as 2
    assert max(flops) == pytest.approx(conv3x3, rel=0.05), flops


def _in_a_fresh_process(code: str, **env) -> str:
    """stdout of `code` in a new interpreter, TVM_NUM_THREADS as given (unset if absent)."""
    import os
    import subprocess
    import sys

    environ = {k: v for k, v in os.environ.items() if k != "TVM_NUM_THREADS"}
    environ.update(env)
    run = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip().splitlines()[-1]


def test_the_compile_time_pool_has_the_artifacts_thread_count(tmp_path):
    """TVM's pool sizes itself once, from TVM_NUM_THREADS, else half the logical CPUs: a
    compile run from a shell timed tuned records against default schedules on one thread of a
    2-vCPU machine, while the artifact runs on both (runtime.loader), and kept the wrong
    ones. compile_model starts the pool at the count its timings assume."""
    from tests.models import tiny_mlp

    model = tiny_mlp(tmp_path / "m.onnx")
    code = ("import os, tvm\n"
            "from tvmopt.interface.compile import CompileOptions, compile_model\n"
            f"compile_model(CompileOptions(model={model!r}, target='host', "
            f"output={str(tmp_path / 'a')!r}, shapes={{'x': [1, 32]}}, verify=False), "
            "log=lambda *a, **k: None)\n"
            "print(tvm.runtime.num_threads(), os.cpu_count())")
    pool, cpus = _in_a_fresh_process(code).split()
    assert pool == cpus


def test_a_pool_started_at_another_size_is_reported(monkeypatch):
    import tvm

    started = tvm.runtime.num_threads()  # this process's pool, started now if it was not
    monkeypatch.setenv("TVM_NUM_THREADS", str(started + 1))
    assert not timing.start_tvm_pool()  # a started pool keeps its size: its timings are not
    monkeypatch.setenv("TVM_NUM_THREADS", str(started))
    assert timing.start_tvm_pool()
