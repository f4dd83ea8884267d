"""bf16 on CPUs with bf16 matrix/dot-product units: which targets offer it, the library kernels'
numerics, the per-kernel choice and the accuracy gate that gives bf16 back kernel by kernel."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.onednn_required import require_onednn
from tvmopt.errors import TvmoptError
from tvmopt.precision.schemes import library_compute
from tvmopt.targets.registry import get_target, host_cpu_features

BF16_UNITS = ("amx_bf16", "avx512_bf16")


def needs_bf16_host():
    if not set(BF16_UNITS) & host_cpu_features():
        pytest.skip(f"this CPU has neither {' nor '.join(BF16_UNITS)} (bf16 library kernels)")
    require_onednn()


@pytest.mark.parametrize("target, precision, expect", [
    ("x86-sapphirerapids", "auto", ("fp32", "bf16")),
    ("x86-zen4", "auto", ("fp32", "bf16")),
    ("x86-sapphirerapids", "bf16", ("fp32", "bf16")),
    ("x86-sapphirerapids", "fp32", ("fp32",)),  # fp32 is exact: no bf16 anywhere
    ("x86-avx512", "auto", ("fp32",)),  # VNNI but no bf16 unit
    ("x86-avx2", "auto", ("fp32",)),  # an AVX2 host stays fp32
    ("x86-avx2", "bf16", ("fp32",)),
    ("a100", "auto", ("fp32",)),  # GPUs: bf16 is a graph rewrite there, not library kernels
])
def test_which_targets_offer_bf16_library_kernels(target, precision, expect):
    assert library_compute(get_target(target), precision) == expect


def test_bf16_without_a_bf16_unit_is_refused_with_the_reason():
    from tvmopt.precision.costs import KernelPlan
    from tvmopt.precision.policy import decide

    k = KernelPlan("m", ["matmul"], 1e9, 1e6, 1e5, 1e6, False, True)
    prec, decisions = decide(get_target("x86-avx2"), [k], "bf16")
    assert prec == "fp32"
    assert any(d.precision == "bf16" and d.action == "downgraded" and "no fast bf16" in d.reason
               for d in decisions)


def test_host_detection_passes_the_matrix_units_to_llvm(monkeypatch):
    from tvm.target import codegen

    from tvmopt.targets import registry

    flags = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"}
    monkeypatch.setattr(codegen, "llvm_get_system_cpu", lambda: "rocketlake")
    monkeypatch.setattr(registry, "host_cpu_features", lambda: set(flags))
    monkeypatch.setattr(registry, "host_arch", lambda: "x86_64")
    host = registry.detect_host()
    assert host.tvm["mcpu"] == "rocketlake"  # what LLVM says; the flags add the rest
    assert {"+amx-bf16", "+amx-int8", "+amx-tile", "+avx512bf16"} <= set(host.tvm["mattr"])
    assert {"amx_bf16", "amx_int8", "avx512_bf16", "avx512_fp16"} <= set(host.features)
    assert "figures from 'x86-sapphirerapids'" in host.description
    assert host.peak_gflops["bf16"].value > host.peak_gflops["fp32"].value
    host.to_tvm()  # LLVM accepts the features


def test_bf16_library_kernels_match_onnxruntime_to_bf16_precision(tmp_path):
    needs_bf16_host()
    import onnxruntime as ort
    import tvm
    from onnx import helper
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.interface.gate import relative_error
    from tvmopt.library import onednn as od
    from tvmopt.runtime.in_memory import host_target

    from ..library.test_onednn import make_model

    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((32, 16, 3, 3)).astype("float32") * 0.1,
             "b": rng.standard_normal(32).astype("float32"),
             "r": rng.standard_normal((1, 32, 14, 14)).astype("float32"),
             "s": np.array([1, -1], dtype=np.int64),
             "w2": rng.standard_normal((32 * 14 * 14, 24)).astype("float32") * 0.02,
             "b2": rng.standard_normal(24).astype("float32")}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["a"]),
             helper.make_node("Add", ["a", "r"], ["res"]),  # the residual (sum post-op)
             helper.make_node("Reshape", ["res", "s"], ["f"]),
             helper.make_node("MatMul", ["f", "w2"], ["m"]),
             helper.make_node("Add", ["m", "b2"], ["y"])]
    model = make_model(nodes, [("x", [1, 16, 14, 14])], "y", inits)
    x = rng.standard_normal((1, 16, 14, 14)).astype("float32")
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    target = host_target().to_tvm()
    front = pipeline.optimize(import_onnx(model).mod, target,
                              pipeline.PipelineConfig(dispatch="codegen"), until="layout").mod
    errors = {}
    for compute in ("fp32", "bf16"):
        mod = od.lower(od.partition(front), None, compute=compute)
        text = mod["main"].script(show_meta=False)
        assert text.count('R.call_dps_packed("tvmopt.onednn.') == 2
        ex = pipeline.build(mod, target, pipeline.PipelineConfig(dispatch="codegen"),
                            start_after="dispatch")
        vm = relax.VirtualMachine(ex, tvm.cpu())
        for _ in range(2):  # the second call reuses the cached primitive and bf16 weights
            out = vm["main"](tvm.runtime.tensor(x)).numpy()
        errors[compute] = relative_error({"y": out}, {"y": ref})[0]
    assert errors["fp32"] < 1e-5
    # bf16 keeps 8 bits of mantissa: errors of a few 1e-3 of the output's range, not 1e-6
    assert 1e-5 < errors["bf16"] < 2e-2, errors


def test_bf16_activations_pass_between_library_kernels_unconverted():
    """Between two bf16 library calls the activation travels as bf16: the producer call writes
    bf16 and the consumer reads it, with no fp32 copy or conversion kernel between. A call
    whose output reaches a TIR kernel or the model's output still writes fp32, and a norm
    feeding a bf16 matmul writes its output as bf16 itself (the conversion fused into it)."""
    needs_bf16_host()
    import onnxruntime as ort
    import tvm
    from onnx import helper
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.interface.gate import relative_error
    from tvmopt.library import onednn as od
    from tvmopt.runtime.in_memory import host_target

    from ..library.test_onednn import make_model

    rng = np.random.default_rng(1)
    inits = {f"w{i}": rng.standard_normal((16, 16, 3, 3)).astype("float32") * 0.1
             for i in (1, 2, 3)}
    inits.update(g=np.ones(16, "float32"), b=np.zeros(16, "float32"),
                 w4=rng.standard_normal((16, 8)).astype("float32") * 0.2)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["a1"]),
             helper.make_node("Conv", ["a1", "w2"], ["c2"], pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["a2"]),
             helper.make_node("Add", ["a2", "a1"], ["r"]),  # a1 also the residual
             helper.make_node("Conv", ["r", "w3"], ["c3"], pads=[1] * 4),
             helper.make_node("Transpose", ["c3"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("LayerNormalization", ["t", "g", "b"], ["n"], axis=-1),
             helper.make_node("MatMul", ["n", "w4"], ["y"])]
    model = make_model(nodes, [("x", [1, 16, 12, 12])], "y", inits)
    x = rng.standard_normal((1, 16, 12, 12)).astype("float32")
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    target = host_target().to_tvm()
    cfg = pipeline.PipelineConfig(dispatch="codegen")
    front = pipeline.optimize(import_onnx(model).mod, target, cfg, until="layout").mod
    mod = od.lower(od.partition(front), None, compute="bf16")
    calls = [b.value for blk in mod["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.call_dps_packed"]
    out_types = [str(c.ty.dtype) for c in calls]
    # conv1 -> conv2 (and conv2's residual) -> conv3: bf16; conv3 -> transpose: fp32; the
    # matmul is the model's output: fp32
    assert out_types == ["bfloat16", "bfloat16", "float32", "float32"], out_types
    casts = [b.value for blk in mod["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.astype"]
    assert len(casts) == 2  # the graph input into conv1, the norm's output into the matmul
    built = pipeline.optimize(mod, target, cfg, start_after="dispatch").mod
    norm = [f.script() for f in built.functions.values()
            if isinstance(f, tvm.tirx.PrimFunc) and "T.axis.reduce" in f.script()]
    assert norm and all('"bfloat16"' in t for t in norm), norm
    ex = pipeline.build(mod, target, cfg, start_after="dispatch")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for _ in range(2):
        out = vm["main"](tvm.runtime.tensor(x)).numpy()
    assert out.dtype == np.float32
    err = relative_error({"y": out}, {"y": ref})[0]
    assert 1e-5 < err < 3e-2, err


def _compile(model, out, **kw):
    from tvmopt.interface.compile import CompileOptions, compile_model

    logged = []
    res = compile_model(CompileOptions(model=model, output=str(out), target="host",
                                       dispatch="auto", **kw), log=logged.append)
    return res, logged


@pytest.fixture
def bf16_always_faster(tmp_path, monkeypatch):
    """Timings where bf16 beats fp32 and codegen on every kernel, so the choice (and what the
    gate does with it) does not depend on this machine's load. precision.choice times each
    workload as oneDNN fp32, oneDNN bf16, then the default schedules."""
    from itertools import cycle

    from tvmopt.precision import choice

    from tvmopt import timing

    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))
    ms = cycle([2.0, 1.0, 4.0])
    monkeypatch.setattr(choice, "measure_call",
                        lambda vm, name, inputs, roof=None: timing.Measurement(*(2 * [next(ms)]), 0.0))


def _cnn(tmp_path):
    from ..library.test_onednn import _small_cnn

    return _small_cnn(tmp_path / "cnn.onnx")


def test_bf16_kernels_are_timed_on_bf16_activations(tmp_path, monkeypatch):
    """In the built model a bf16 call's activations arrive bf16 (converted by their producer),
    so its timing feeds it bf16 and does not charge it a conversion; fp32 and codegen are
    timed on fp32 inputs."""
    needs_bf16_host()
    from tvmopt.precision import choice
    from tvmopt import timing

    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))
    seen = []

    def measure(vm, name, inputs, roof=None):
        seen.append(tuple(str(t.dtype) for t in inputs if hasattr(t, "dtype")))
        return timing.Measurement(1.0, 1.0, 0.0)

    monkeypatch.setattr(choice, "measure_call", measure)
    _compile(_cnn(tmp_path), tmp_path / "a", precision="bf16")
    kinds = {dt for call in seen for dt in call}
    assert kinds == {"float32", "bfloat16"}, seen
    # per kernel: fp32 library, bf16 library, codegen; only the bf16 side gets bf16
    assert all(("bfloat16" in call) == (i % 3 == 1) for i, call in enumerate(seen)), seen


def test_auto_keeps_bf16_where_it_is_faster_and_within_the_gate(tmp_path, bf16_always_faster):
    needs_bf16_host()
    res, logged = _compile(_cnn(tmp_path), tmp_path / "a", verify=True)
    m = res.artifact.manifest
    choices = m["kernels"]["choices"]
    assert choices and all(c["choice"] == "library" and c["precision"] == "bf16"
                           for c in choices)
    assert all(c["library_bf16_ms"] == 1.0 and c["library_ms"] == 2.0 for c in choices)
    prec = m["precision"]
    assert prec["default"] == "bf16"
    gate = prec["gate"]
    assert gate["limit"] == 0.02 and gate["limit_from"] == "default"
    assert gate["reference"] == "onnxruntime" and gate["inputs"].startswith("seeded random")
    assert len(gate["attempts"]) == 1 and gate["attempts"][0]["passed"]
    assert 0 < gate["attempts"][0]["error"] <= 0.02
    assert gate["result"].startswith("kept bf16") and gate["fp32_only"] == []
    assert any("gate: error" in line and "passed" in line for line in logged)
    # --verify checked it to the gate's limit (fp32's 1e-4 would fail a bf16 build)
    assert all(e.mismatched == 0 for e in res.verification)
    assert res.verification[0].max_abs > 1e-6  # it did run in bf16


def test_bf16_within_the_gain_of_fp32_is_not_worth_its_error(tmp_path, monkeypatch):
    """bf16 costs accuracy, so a library call stays fp32 unless bf16 takes under
    LOWER_PRECISION_GAIN of its time: a gain inside the timing noise flipped from one compile
    to the next."""
    needs_bf16_host()
    from tvmopt.precision import choice
    from tvmopt import timing

    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))
    gain = choice.LOWER_PRECISION_GAIN
    # per kernel: oneDNN fp32, oneDNN bf16 just short of the gain, then the default schedules
    times = iter([2.0, 2.0 * gain + 0.01, 4.0] * 20)
    monkeypatch.setattr(choice, "measure_call", lambda vm, name, inputs, roof=None:
                        timing.Measurement(*(2 * [next(times)]), 0.0))
    res, logged = _compile(_cnn(tmp_path), tmp_path / "a")
    choices = res.artifact.manifest["kernels"]["choices"]
    assert choices and all(c["choice"] == "library" and c["precision"] == "fp32"
                           and "fp32 kept: bf16 not 1.1x faster" in c["note"]
                           for c in choices), choices
    assert res.artifact.manifest["precision"]["default"] == "fp32"
    assert not any("gate: error" in line for line in logged)  # nothing in bf16 to gate


def test_a_gate_breach_gives_bf16_back_kernel_by_kernel(tmp_path, bf16_always_faster):
    needs_bf16_host()
    res, logged = _compile(_cnn(tmp_path), tmp_path / "a", max_error=1e-9)
    m = res.artifact.manifest
    gate = m["precision"]["gate"]
    assert gate["limit_from"] == "--max-error"
    attempts = gate["attempts"]
    # three bf16 workloads: half (2) back, then the last one; nothing left in bf16 after
    assert [a["lower_workloads"] for a in attempts] == [3, 1]
    assert not any(a["passed"] for a in attempts)
    assert gate["result"].startswith("fp32") and len(gate["fp32_only"]) == 3
    choices = m["kernels"]["choices"]
    assert all(c["precision"] == "fp32" for c in choices)
    assert all("taken back by the accuracy gate" in c["note"] for c in choices)
    assert m["precision"]["default"] == "fp32"
    assert sum("back to fp32, rebuilding" in line for line in logged) == 2


def test_precision_fp32_times_no_bf16_and_runs_no_gate(tmp_path, bf16_always_faster):
    needs_bf16_host()
    res, _ = _compile(_cnn(tmp_path), tmp_path / "a", precision="fp32")
    m = res.artifact.manifest
    assert all(c["library_bf16_ms"] is None and c["precision"] == "fp32"
               for c in m["kernels"]["choices"])
    assert "gate" not in m["precision"] and m["precision"]["default"] == "fp32"


def test_calibration_inputs_feed_the_gate(tmp_path, bf16_always_faster):
    needs_bf16_host()
    cal = tmp_path / "cal.npz"
    np.savez(cal, x=np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype("float32"))
    res, _ = _compile(_cnn(tmp_path), tmp_path / "a", calibration=str(cal))
    assert res.artifact.manifest["precision"]["gate"]["inputs"] == "--calibration cal.npz"


def test_a_calibration_file_that_does_not_fit_the_model_is_refused(tmp_path):
    from tvmopt.interface.gate import load_calibration
    from tvmopt.tensor_info import TensorInfo

    inputs = [TensorInfo("x", "float32", (1, 8, 16, 16))]
    bad = tmp_path / "bad.npz"
    np.savez(bad, y=np.zeros((1, 8, 16, 16), "float32"))
    with pytest.raises(TvmoptError, match="missing \\['x'\\], unknown \\['y'\\]"):
        load_calibration(str(bad), inputs)
    rank = tmp_path / "rank.npz"
    np.savez(rank, x=np.zeros((8, 16, 16), "float32"))
    with pytest.raises(TvmoptError, match="input 'x' has shape"):
        load_calibration(str(rank), inputs)
    junk = tmp_path / "junk.npz"
    junk.write_text("not a zip")
    with pytest.raises(TvmoptError, match="cannot read"):
        load_calibration(str(junk), inputs)


def test_a_build_host_without_bf16_units_keeps_fp32_and_says_why(tmp_path, monkeypatch,
                                                                  bf16_always_faster):
    require_onednn()
    from tvmopt import pipeline
    from tvmopt.precision import choice
    from tvmopt.interface.compile import CompileOptions, compile_model

    monkeypatch.setattr(choice, "host_has_bf16", lambda: False)
    logged = []
    res = compile_model(CompileOptions(model=_cnn(tmp_path), output=str(tmp_path / "a"),
                                       target="x86-avx2", dispatch="auto"), log=logged.append)
    # x86-avx2 offers no bf16 at all; the AMX preset offers it, and the host cannot time it
    assert not any("bf16 units" in n for n in res.artifact.manifest["kernels"]["notes"])
    cfg = pipeline.PipelineConfig(dispatch="auto", library_compute=("fp32", "bf16"))
    import onnx

    from tvmopt.frontend.importer import import_onnx

    mod = import_onnx(onnx.load(_cnn(tmp_path))).mod
    records = pipeline.optimize(mod, get_target("x86-sapphirerapids").to_tvm(), cfg, until="dispatch").records
    assert any("no bf16 units" in n for n in records.notes)
    assert all(c.library_bf16_ms is None and c.precision == "fp32"
               for c in records.choices)


def test_lowering_leaves_the_partitioned_module_as_it_was(tmp_path):
    """The dispatch timing lowers one partitioned module once per compute precision: lowering
    must not rewrite its input (it did, and the bf16 side then timed the fp32 calls)."""
    import onnx
    import tvm
    import tvm_ffi
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.library import onednn as od
    from tvmopt.library.onednn.lower import _compute_of
    from tvmopt.runtime.in_memory import host_target

    mod = import_onnx(onnx.load(_cnn(tmp_path))).mod
    front = pipeline.optimize(mod, host_target().to_tvm(),
                              pipeline.PipelineConfig(dispatch="codegen"), until="layout").mod
    part = od.partition(front)
    before = part.clone()

    def computes(lowered):
        found = []

        def visit(e):
            if isinstance(e, relax.Call) and e.op.same_as(tvm.ir.Op.get("relax.call_dps_packed")):
                found.append(_compute_of(e))

        relax.analysis.post_order_visit(lowered["main"], visit)
        return found

    assert set(computes(od.lower(part, compute="fp32"))) == {od.COMPUTE["fp32"]}
    assert tvm_ffi.structural_equal(part, before)
    assert set(computes(od.lower(part, compute="bf16"))) == {od.COMPUTE["bf16"]}
