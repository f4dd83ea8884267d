"""oneDNN dispatch: each conv2d/matmul chain becomes one packed call and matches onnxruntime,
through the pipeline's --dispatch library path and in each layout mode of the rewrite; the
per-kernel timing choice, its cache, artifacts that need the extension, and the fallback."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvmopt.library import onednn as od
RTOL = ATOL = 1e-4


@pytest.fixture(scope="module", autouse=True)
def extension(onednn_extension):
    return onednn_extension


def count_packed(mod, name):
    return mod.script(show_meta=False).count(f'R.call_dps_packed("{name}"')


def make_model(nodes, inputs, output, inits, opset=17):
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def run_case(name, model, inputs, expect, layout=None, nhwc=False):
    """Through the pipeline (layout None: its NHWC/HWIO graph), or the rewrite alone in one of
    its layout modes (activations reordered per call, pinned NCHW, NHWC/OHWI)."""
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    target = host_target().to_tvm()
    mod = import_onnx(model).mod
    if layout is None:
        cfg = pipeline.PipelineConfig(dispatch="library")
        mod = pipeline.optimize(mod, target, cfg, until="dispatch").mod
        rest = dict(cfg=cfg, start_after="dispatch")
    else:
        mod = od.dispatch_onednn(pipeline.optimize(mod, target, pipeline.PipelineConfig(
            channels_last=False), until="simplify").mod, conv_layout=layout, nhwc=nhwc)
        rest = dict(cfg=pipeline.PipelineConfig(channels_last=False), start_after="dispatch")
    got = {f: count_packed(mod, f) for f in (od.CONV_FUNC, od.MATMUL_FUNC)}
    assert got == expect, f"{name}: expected calls {expect}, got {got}"
    vm = relax.VirtualMachine(pipeline.build(mod, target, **rest), tvm.cpu())
    for _ in range(2):  # the second run hits the cached primitive and reordered weight
        out = vm["main"](*[tvm.runtime.tensor(v) for v in inputs.values()]).numpy()
        np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL, err_msg=name)
    return mod


def sigmoids_left(mod) -> int:
    """R.sigmoid calls outside the packed oneDNN calls (a fused SiLU leaves none)."""
    return mod["main"].script(show_meta=False).count("R.sigmoid(")


rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def conv_case(name, cin=8, cout=16, hw=14, k=3, stride=1, pad=1, dil=1, group=1, bias=True,
              act=None, residual=False, post_relu=False, layout=None, nhwc=False):
    inits = {"W": rand(cout, cin // group, k, k) * 0.2}
    ins = ["x", "W"]
    if bias:
        inits["B"] = rand(cout)
        ins.append("B")
    nodes = [helper.make_node("Conv", ins, ["c"], kernel_shape=[k, k], strides=[stride] * 2,
                              pads=[pad] * 4, dilations=[dil] * 2, group=group)]
    cur = "c"
    if act == "relu":
        nodes.append(helper.make_node("Relu", [cur], ["a"]))
        cur = "a"
    elif act == "relu6":
        inits["lo"] = np.array(0, np.float32)
        inits["hi"] = np.array(6, np.float32)
        nodes.append(helper.make_node("Clip", [cur, "lo", "hi"], ["a"]))
        cur = "a"
    elif act in ("silu", "silu_rev"):  # x * sigmoid(x), as torch exports SiLU, either order
        nodes.append(helper.make_node("Sigmoid", [cur], ["s"]))
        nodes.append(helper.make_node("Mul", [cur, "s"] if act == "silu" else ["s", cur], ["a"]))
        cur = "a"
    inputs = {"x": rand(1, cin, hw, hw)}
    graph_inputs = [("x", [1, cin, hw, hw])]
    if residual:
        oh = (hw + 2 * pad - dil * (k - 1) - 1) // stride + 1
        inputs["skip"] = rand(1, cout, oh, oh)
        graph_inputs.append(("skip", [1, cout, oh, oh]))
        nodes.append(helper.make_node("Add", [cur, "skip"], ["r"]))
        cur = "r"
        if post_relu:
            nodes.append(helper.make_node("Relu", [cur], ["p"]))
            cur = "p"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    model = make_model(nodes, graph_inputs, "y", inits)
    if nhwc and layout is None:
        layout = od.LAYOUT_AUTO
    mod = run_case(name, model, inputs, {od.CONV_FUNC: 1, od.MATMUL_FUNC: 0}, layout, nhwc)
    if act in ("silu", "silu_rev"):
        assert sigmoids_left(mod) == 0, f"{name}: SiLU left outside the oneDNN call"


def conv_shared_intermediate():
    """conv -> relu, where the pre-activation is also an output: must not fuse the relu away."""
    inits = {"W": rand(8, 4, 3, 3), "B": rand(8)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["a"]),
             helper.make_node("Add", ["a", "c"], ["y"])]
    model = make_model(nodes, [("x", [1, 4, 10, 10])], "y", inits)
    run_case("conv_shared_intermediate", model, {"x": rand(1, 4, 10, 10)},
             {od.CONV_FUNC: 1, od.MATMUL_FUNC: 0})


def conv_times_sigmoid_of_another():
    """conv * sigmoid(gate) (squeeze-excite's scaling) is not SiLU: the multiply stays out."""
    inits = {"W": rand(8, 8, 1, 1), "B": rand(8)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"]),
             helper.make_node("Sigmoid", ["g"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    model = make_model(nodes, [("x", [1, 8, 6, 6]), ("g", [1, 8, 6, 6])], "y", inits)
    mod = run_case("conv_times_sigmoid_of_another", model,
                   {"x": rand(1, 8, 6, 6), "g": rand(1, 8, 6, 6)},
                   {od.CONV_FUNC: 1, od.MATMUL_FUNC: 0})
    assert sigmoids_left(mod) == 1


def gemm_case(name, m=4, k=64, n=32, trans_b=True, bias=True, relu=False):
    w = rand(n, k) if trans_b else rand(k, n)
    inits = {"W": w * 0.1}
    ins = ["x", "W"]
    if bias:
        inits["B"] = rand(n)
        ins.append("B")
    nodes = [helper.make_node("Gemm", ins, ["g"], transB=int(trans_b))]
    cur = "g"
    if relu:
        nodes.append(helper.make_node("Relu", [cur], ["r"]))
        cur = "r"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    model = make_model(nodes, [("x", [m, k])], "y", inits)
    run_case(name, model, {"x": rand(m, k)}, {od.CONV_FUNC: 0, od.MATMUL_FUNC: 1})


def matmul_case(name, a_shape, b_shape, bias=False, act=None, opset=17):
    inits = {"W": rand(*b_shape) * 0.1}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"])]
    cur = "m"
    if bias:
        inits["B"] = rand(b_shape[-1])
        nodes.append(helper.make_node("Add", [cur, "B"], ["b"]))
        cur = "b"
    if act == "relu":
        nodes.append(helper.make_node("Relu", [cur], ["r"]))
        cur = "r"
    elif act in ("gelu", "gelu_tanh"):
        nodes.append(helper.make_node("Gelu", [cur], ["r"],
                                      approximate="tanh" if act == "gelu_tanh" else "none"))
        cur = "r"
    elif act == "silu":
        nodes.append(helper.make_node("Sigmoid", [cur], ["s"]))
        nodes.append(helper.make_node("Mul", ["s", cur], ["r"]))
        cur = "r"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    model = make_model(nodes, [("x", list(a_shape))], "y", inits, opset=opset)
    mod = run_case(name, model, {"x": rand(*a_shape)}, {od.CONV_FUNC: 0, od.MATMUL_FUNC: 1})
    if act == "silu":
        assert sigmoids_left(mod) == 0, f"{name}: SiLU left outside the oneDNN call"


def residual_matmul_case(name, a_shape, n, bias=True, twice=False):
    """y = x_res + (x @ W [+ B]): a transformer's projection back into its residual stream
    (x_res an input of the output's shape). `twice`: a second projection adds into the first's
    result, whose buffer the memory plan may hand to the second call's output."""
    inits = {"W": rand(a_shape[-1], n) * 0.1, "B": rand(n)}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"])]
    cur = "m"
    if bias:
        nodes.append(helper.make_node("Add", [cur, "B"], ["b"]))
        cur = "b"
    nodes.append(helper.make_node("Add", ["r", cur], ["y0"]))
    cur = "y0"
    if twice:
        inits["W2"] = rand(n, n) * 0.1
        nodes += [helper.make_node("MatMul", [cur, "W2"], ["m2"]),
                  helper.make_node("Add", ["m2", cur], ["y1"])]
        cur = "y1"
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    out_shape = list(a_shape[:-1]) + [n]
    model = make_model(nodes, [("x", list(a_shape)), ("r", out_shape)], "y", inits)
    mod = run_case(name, model, {"x": rand(*a_shape), "r": rand(*out_shape)},
                   {od.CONV_FUNC: 0, od.MATMUL_FUNC: 2 if twice else 1})
    # the residual add is the call's sum post-op, not a kernel of its own
    assert "R.add" not in mod["main"].script(show_meta=False), name


CASES = [
    ("matmul_bias_residual", lambda: residual_matmul_case("matmul_bias_residual", (2, 7, 48),
                                                          32)),
    ("matmul_residual_chain", lambda: residual_matmul_case("matmul_residual_chain", (9, 24), 24,
                                                           bias=False, twice=True)),
    ("conv1x1", lambda: conv_case("conv1x1", k=1, pad=0)),
    ("conv3x3_pad1", lambda: conv_case("conv3x3_pad1")),
    ("conv3x3_stride2", lambda: conv_case("conv3x3_stride2", stride=2)),
    ("conv7x7_stride2_pad3", lambda: conv_case("conv7x7_stride2_pad3", cin=3, k=7, stride=2,
                                               pad=3, hw=32)),
    ("conv_depthwise", lambda: conv_case("conv_depthwise", cin=16, cout=16, group=16)),
    ("conv_depthwise_s2_relu6", lambda: conv_case("conv_depthwise_s2_relu6", cin=16, cout=16,
                                                  group=16, stride=2, act="relu6")),
    ("conv_grouped", lambda: conv_case("conv_grouped", cin=8, cout=16, group=2)),
    ("conv_dilation2", lambda: conv_case("conv_dilation2", pad=2, dil=2)),
    ("conv_nobias", lambda: conv_case("conv_nobias", bias=False)),
    ("conv_relu", lambda: conv_case("conv_relu", act="relu")),
    ("conv_relu6", lambda: conv_case("conv_relu6", act="relu6")),
    ("conv_silu", lambda: conv_case("conv_silu", act="silu")),
    ("conv_nhwc_depthwise_silu_reversed", lambda: conv_case(
        "conv_nhwc_depthwise_silu_reversed", cin=16, cout=16, group=16, act="silu_rev",
        nhwc=True)),
    ("conv_silu_residual", lambda: conv_case("conv_silu_residual", act="silu", residual=True)),
    ("conv_times_sigmoid_of_another", conv_times_sigmoid_of_another),
    ("conv_residual", lambda: conv_case("conv_residual", residual=True)),
    ("conv_residual_relu", lambda: conv_case("conv_residual_relu", residual=True,
                                             post_relu=True)),
    ("conv_nobias_residual_relu", lambda: conv_case("conv_nobias_residual_relu", bias=False,
                                                    residual=True, post_relu=True)),
    ("conv_relu_residual_relu", lambda: conv_case("conv_relu_residual_relu", act="relu",
                                                  residual=True, post_relu=True)),
    ("conv_plain_3x3_residual_relu", lambda: conv_case(
        "conv_plain_3x3_residual_relu", residual=True, post_relu=True,
        layout=od.LAYOUT_PLAIN)),
    ("conv_plain_depthwise_relu6", lambda: conv_case(
        "conv_plain_depthwise_relu6", cin=16, cout=16, group=16, act="relu6",
        layout=od.LAYOUT_PLAIN)),
    ("conv_nhwc_3x3_residual_relu", lambda: conv_case(
        "conv_nhwc_3x3_residual_relu", residual=True, post_relu=True, nhwc=True)),
    ("conv_nhwc_stride2_1x1", lambda: conv_case("conv_nhwc_stride2_1x1", k=1, pad=0, stride=2,
                                                nhwc=True)),
    ("conv_nhwc_depthwise_relu6", lambda: conv_case(
        "conv_nhwc_depthwise_relu6", cin=16, cout=16, group=16, act="relu6", nhwc=True)),
    ("conv_nhwc_grouped_dil", lambda: conv_case("conv_nhwc_grouped_dil", group=4, pad=2, dil=2,
                                                nhwc=True)),
    ("conv_nchw_reordered_residual_relu", lambda: conv_case(
        "conv_nchw_reordered_residual_relu", residual=True, post_relu=True,
        layout=od.LAYOUT_AUTO)),
    # a network's stem (3 input channels): oneDNN's own choice of layout would be reordered
    # in and out, so the call takes its kernel on the caller's layout instead
    ("conv_nhwc_stem_3ch_stride2_relu6", lambda: conv_case(
        "conv_nhwc_stem_3ch_stride2_relu6", cin=3, cout=16, stride=2, act="relu6", nhwc=True)),
    ("conv_nchw_stem_3ch_7x7_relu", lambda: conv_case(
        "conv_nchw_stem_3ch_7x7_relu", cin=3, cout=16, k=7, pad=3, stride=2, act="relu",
        layout=od.LAYOUT_AUTO)),
    ("conv_shared_intermediate", conv_shared_intermediate),
    ("gemm_transb_bias", lambda: gemm_case("gemm_transb_bias")),
    ("gemm_bias_relu", lambda: gemm_case("gemm_bias_relu", relu=True)),
    ("gemm_notrans_nobias", lambda: gemm_case("gemm_notrans_nobias", trans_b=False,
                                              bias=False)),
    ("matmul_3d_bias_relu", lambda: matmul_case("matmul_3d_bias_relu", (2, 5, 48), (48, 24),
                                                bias=True, act="relu")),
    ("matmul_4d_batched_const", lambda: matmul_case("matmul_4d_batched_const", (2, 3, 5, 16),
                                                    (2, 3, 16, 8))),
    ("matmul_gelu", lambda: matmul_case("matmul_gelu", (4, 32), (32, 16), bias=True,
                                        act="gelu", opset=20)),
    ("matmul_gelu_tanh", lambda: matmul_case("matmul_gelu_tanh", (4, 32), (32, 16), bias=True,
                                             act="gelu_tanh", opset=20)),
    ("matmul_silu", lambda: matmul_case("matmul_silu", (4, 32), (32, 16), bias=True,
                                        act="silu")),
]




@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_chain_is_one_packed_call_and_matches(name, case):
    case()


def _small_cnn(path):
    """Two convs of one workload, one of another, a Gemm: three workloads, four sites."""
    import onnx

    inits = {"W1": rand(8, 8, 3, 3) * 0.2, "W2": rand(8, 8, 3, 3) * 0.2,
             "W3": rand(16, 8, 1, 1) * 0.2, "FW": rand(16, 10) * 0.1, "FB": rand(10)}
    nodes = [helper.make_node("Conv", ["x", "W1"], ["c1"], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "W3"], ["c3"]),
             helper.make_node("GlobalAveragePool", ["c3"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "FW", "FB"], ["y"])]
    model = make_model(nodes, [("x", [1, 8, 16, 16])], "y", inits)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10]))
    onnx.save(model, str(path))
    return str(path)


def test_auto_times_each_workload_once_then_reads_the_cache(tmp_path, monkeypatch):
    from tvmopt.interface.compile import CompileOptions, compile_model
    from tvmopt.precision import choice
    from tvmopt import timing

    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))  # extension already loaded
    # What is under test is the cache, not how quiet this machine is: every timing is trusted
    # (tests/timing/test_timing.py covers the untrusted ones).
    monkeypatch.setattr(timing, "FOREIGN_LOAD_LIMIT", float("inf"))
    monkeypatch.setattr(timing, "CEILING_FLOORS", float("inf"))
    monkeypatch.setattr(timing, "SPREAD", float("inf"))
    model = _small_cnn(tmp_path / "cnn.onnx")

    def kernels(out):
        res = compile_model(CompileOptions(model=model, output=str(tmp_path / out),
                                           dispatch="auto", verify=True), log=lambda s: None)
        return res.artifact.manifest["kernels"]

    first = kernels("a")
    assert first["dispatch"] == "auto" and first["layout"] == "NHWC"
    choices = first["choices"]
    assert sorted(c["sites"] for c in choices) == [1, 1, 2]
    for c in choices:
        assert c["library_ms"] > 0 and c["codegen_ms"] > 0 and not c["cached"]
        faster = c["library_ms"] < choice.MARGIN * c["codegen_ms"]
        assert c["choice"] == ("library" if faster else "codegen")
    assert first["requires"] == (["onednn"] if any(c["choice"] == "library" for c in choices)
                                 else [])
    second = kernels("b")
    assert all(c["cached"] for c in second["choices"])
    assert [c["choice"] for c in second["choices"]] == [c["choice"] for c in choices]


def test_library_artifact_runs_in_a_fresh_process(tmp_path):
    from tvmopt.interface.compile import CompileOptions, compile_model

    model = _small_cnn(tmp_path / "cnn.onnx")
    res = compile_model(CompileOptions(model=model, output=str(tmp_path / "a"),
                                       dispatch="library"), log=lambda s: None)
    manifest = res.artifact.manifest["kernels"]
    assert manifest["build"] == "dispatched" and manifest["requires"] == ["onednn"]
    assert all(c["choice"] == "library" for c in manifest["choices"])
    x = rand(1, 8, 16, 16)
    np.savez(tmp_path / "in.npz", x=x)
    run = subprocess.run([sys.executable, "-m", "tvmopt.cli", "run", str(tmp_path / "a"), "--inputs",
                          str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "out.npz")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], ref, rtol=RTOL, atol=ATOL)


def test_unloadable_library_falls_back_to_default_schedules_and_says_so(tmp_path,
                                                                        monkeypatch):
    from tvmopt.interface.compile import CompileOptions, compile_model

    def broken(*a, **k):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(od, "load_extension", broken)
    logs = []
    res = compile_model(CompileOptions(model=_small_cnn(tmp_path / "cnn.onnx"), verify=True,
                                       output=str(tmp_path / "a"), dispatch="auto"),
                        log=logs.append)
    kernels = res.artifact.manifest["kernels"]
    assert kernels["build"] == "untuned" and kernels["requires"] == []
    assert any("oneDNN unavailable (no C++ compiler found)" in n for n in kernels["notes"])
    assert any(line.startswith("note: oneDNN unavailable") for line in logs)
    assert all(e.mismatched == 0 for e in res.verification)


def test_library_artifact_runs_its_tvm_kernels_on_the_openmp_team(tmp_path):
    """A model mixing oneDNN and TVM kernels uses one thread pool, and stays exact."""
    import tvm_ffi

    import tvmopt
    from tvmopt.interface.compile import CompileOptions, compile_model

    model = _small_cnn(tmp_path / "cnn.onnx")
    res = compile_model(CompileOptions(model=model, output=str(tmp_path / "a"),
                                       dispatch="library"), log=lambda s: None)
    codegen = compile_model(CompileOptions(model=model, output=str(tmp_path / "c"),
                                           dispatch="codegen"), log=lambda s: None)
    lm, lc = tvmopt.load(res.artifact.path), tvmopt.load(codegen.artifact.path)
    uses = tvm_ffi.get_global_func("tvmopt.onednn.uses_shared_pool")
    assert uses(str(lm.artifact.library))
    assert not uses(str(lc.artifact.library))  # no oneDNN kernel: TVM's pool is left alone
    assert not uses(str(tmp_path / "not-loaded.so"))
    x = rand(1, 8, 16, 16)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for _ in range(3):  # the team is reused call after call
        np.testing.assert_allclose(lm.run({"x": x})["y"], ref, rtol=RTOL, atol=ATOL)


def test_plan_shows_each_dispatch_choice_with_its_timings(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tvmopt.interface.plan_model import plan_model
    from tvmopt.cli.main import main
    from tvmopt.precision import choice
    from tvmopt import timing
    from tvmopt.targets.registry import get_target

    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))
    # the cache's reuse is under test, not how quiet the machine is (test_timing.py is)
    monkeypatch.setattr(timing, "FOREIGN_LOAD_LIMIT", float("inf"))
    monkeypatch.setattr(timing, "CEILING_FLOORS", float("inf"))
    monkeypatch.setattr(timing, "SPREAD", float("inf"))
    model = _small_cnn(tmp_path / "cnn.onnx")
    p = plan_model(model, get_target("x86"), dispatch="auto")
    assert sorted(c["sites"] for c in p.dispatch) == [1, 1, 2]
    for c in p.dispatch:
        assert c["library_ms"] > 0 and c["codegen_ms"] > 0
        faster = c["library_ms"] < choice.MARGIN * c["codegen_ms"]
        assert c["choice"] == ("library" if faster else "codegen")
    assert p.to_json()["dispatch"] == p.dispatch
    assert plan_model(model, get_target("x86")).dispatch == []  # codegen: nothing timed
    from tvmopt import console as cons

    width = cons.console.width
    try:
        out = CliRunner().invoke(main, ["plan", model, "--dispatch", "auto", "--wide"])
    finally:  # --wide sets the process-wide console: later tests need it as it was
        cons.set_wide(False)
        cons.console.width = width
    assert out.exit_code == 0, out.output
    assert "dispatch (each workload timed" in out.output and "1x16x16x8" in out.output
    assert "yes" in out.output  # the second time, every workload comes from the cache


@pytest.mark.slow
def test_tune_leaves_out_the_kernels_compile_gives_onednn(tmp_path):
    from tvmopt.targets.registry import get_target
    from tvmopt.tuning import tune
    from tvmopt.tuning.tasks import extract_tasks

    hw = get_target("x86")
    model = _small_cnn(tmp_path / "cnn.onnx")

    def task_names(dispatch):
        fused, _, choices = tune.fused_module(model, {}, hw, dispatch=dispatch)
        return {t.name for t in extract_tasks(fused, hw.to_tvm())}, choices

    everything, none = task_names("codegen")
    left, choices = task_names("library")
    assert none == [] and sum(c.sites for c in choices) == 4
    assert any("conv2d" in n for n in everything)
    assert left and left < everything and not any("conv2d" in n or "matmul" in n for n in left)

    res = tune.tune(tune.TuneOptions(model=model, trials=2, db=str(tmp_path / "db"),
                                     trials_per_round=2, population=16, dispatch="library"))
    assert {t.name for t in res.tasks} == left
    from tvmopt.tuning.database import MANIFEST_FILE

    manifest = json.loads((tmp_path / "db" / MANIFEST_FILE).read_text())
    assert manifest["dispatch"] == "library"


def test_a_group_given_back_to_codegen_is_the_kernel_codegen_fuses():
    """A ReLU6 conv oneDNN could take but codegen keeps fuses to the same function as in the
    all-codegen pipeline (clip bounds as immediates), so a tuning record of one serves both."""
    import tvm_ffi

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.targets.registry import get_target
    from tvmopt.tuning.tasks import extract_tasks

    inits = {"W1": rand(8, 8, 3, 3) * 0.2, "W2": rand(8, 8, 1, 1) * 0.2,
             "lo": np.array(0.0, "float32"), "hi": np.array(6.0, "float32")}
    nodes = [helper.make_node("Conv", ["x", "W1"], ["c1"], pads=[1] * 4),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
             helper.make_node("Conv", ["r1", "W2"], ["c2"]),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["y"])]
    model = make_model(nodes, [("x", [1, 8, 16, 16])], "y", inits)
    hw = get_target("x86")
    target = hw.to_tvm()
    cfg = pipeline.PipelineConfig(dispatch="codegen", hw=hw)
    before = pipeline.optimize(import_onnx(model).mod, target, cfg, until="layout").mod

    def task_hashes(mod):
        fused = pipeline.optimize(mod, target, pipeline.PipelineConfig(dispatch="codegen", hw=hw),
                                  start_after="dispatch", until="fuse").mod
        return sorted(tvm_ffi.structural_hash(t.mod) for t in extract_tasks(fused, target))

    part = od.partition(before)
    assert len(od.composites(part)) == 2
    assert task_hashes(od.lower(part, keep=set())) == task_hashes(before)
