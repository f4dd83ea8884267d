"""oneDNN int8 kernels for QDQ models: each quantized conv2d / matmul becomes one int8 packed
call that matches onnxruntime on the same QDQ model to within a couple of quantization steps of
the output, and the precision decision says int8 was chosen.

The models are built with onnx.helper in the layout onnxruntime's `quantize_static` writes
(per-channel symmetric int8 weights, u8 activations with a zero point, int32 bias dequantized
with scale x_scale * w_scale): what the QDQ patterns exist for.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.onednn_required import require_onednn
from tvmopt.library import onednn as od


@pytest.fixture(scope="module", autouse=True)
def int8_host():
    from tvmopt.targets.registry import host_cpu_features

    why = od.int8_unavailable(host_cpu_features())
    if why:
        pytest.skip(f"this host has {why}")
    require_onednn()


rng = np.random.default_rng(0)


def _q(name, x, scale, zp, out, nodes, inits, qtype=np.uint8):
    """QuantizeLinear -> DequantizeLinear of an activation (per tensor)."""
    inits[f"{name}_s"] = np.array(scale, np.float32)
    inits[f"{name}_z"] = np.array(zp, qtype)
    nodes += [helper.make_node("QuantizeLinear", [x, f"{name}_s", f"{name}_z"], [f"{name}_q"]),
              helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"],
                               [out])]


def _weight(name, w, axis, nodes, inits):
    """Per-channel symmetric int8 weight along `axis`, as quantize_static writes it."""
    red = tuple(i for i in range(w.ndim) if i != axis)
    scale = (np.abs(w).max(axis=red) / 127).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    inits[f"{name}_wq"], inits[f"{name}_ws"] = q, scale
    inits[f"{name}_wz"] = np.zeros(scale.shape, np.int8)
    nodes.append(helper.make_node("DequantizeLinear", [f"{name}_wq", f"{name}_ws", f"{name}_wz"],
                                  [f"{name}_w"], axis=axis))
    return scale


def _bias(name, b, x_scale, w_scale, nodes, inits):
    s = (x_scale * w_scale).astype(np.float32)
    inits[f"{name}_bq"] = np.rint(b / s).astype(np.int32)
    inits[f"{name}_bs"], inits[f"{name}_bz"] = s, np.zeros(s.shape, np.int32)
    nodes.append(helper.make_node("DequantizeLinear", [f"{name}_bq", f"{name}_bs", f"{name}_bz"],
                                  [f"{name}_b"], axis=0))


def _model(nodes, inits, x_shape, out):
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def qdq_cnn():
    """Two QDQ convolutions (the second depthwise, strided) with relu, and a shared input
    quantization feeding both the first convolution and a residual-like 1x1 branch."""
    nodes, inits = [], {}
    xs = 0.02
    _q("in", "x", xs, 128, "xd", nodes, inits)
    specs = [("c1", "xd", 16, 8, 3, 1, 1, "r1"), ("c2", "a1d", 16, 1, 3, 2, 16, "r2"),
             ("c3", "xd", 16, 8, 1, 2, 1, "r3")]
    in_scale = {"xd": xs, "a1d": 0.03}
    for name, src, cout, cin, k, stride, group, out in specs:
        w = rng.standard_normal((cout, cin, k, k)).astype(np.float32) * 0.3
        ws = _weight(name, w, 0, nodes, inits)
        _bias(name, rng.standard_normal(cout).astype(np.float32) * 0.1, in_scale[src], ws,
              nodes, inits)
        nodes.append(helper.make_node("Conv", [src, f"{name}_w", f"{name}_b"], [f"{name}_y"],
                                      kernel_shape=[k, k], strides=[stride, stride],
                                      pads=[k // 2] * 4, group=group))
        nodes.append(helper.make_node("Relu", [f"{name}_y"], [out]))
        if name == "c1":
            _q("a1", out, in_scale["a1d"], 0, "a1d", nodes, inits)
    _q("o2", "r2", 0.05, 0, "r2d", nodes, inits)
    _q("o3", "r3", 0.05, 0, "r3d", nodes, inits)
    nodes.append(helper.make_node("Add", ["r2d", "r3d"], ["sum"]))
    _q("out", "sum", 0.05, 0, "y", nodes, inits)
    return _model(nodes, inits, [1, 8, 16, 16], "y"), {"x": rng.standard_normal(
        (1, 8, 16, 16)).astype(np.float32)}, 3, 0.05


def qdq_mlp():
    """Gemm(transB) -> Relu -> MatMul, QDQ, with batch dims folded into M."""
    nodes, inits = [], {}
    _q("in", "x", 0.02, 128, "xd", nodes, inits)
    w1 = rng.standard_normal((64, 32)).astype(np.float32) * 0.2
    s1 = _weight("l1", w1, 0, nodes, inits)
    _bias("l1", rng.standard_normal(64).astype(np.float32) * 0.1, 0.02, s1, nodes, inits)
    nodes += [helper.make_node("Gemm", ["xd", "l1_w", "l1_b"], ["h"], transB=1),
              helper.make_node("Relu", ["h"], ["hr"])]
    _q("h", "hr", 0.04, 0, "hd", nodes, inits)
    w2 = rng.standard_normal((64, 16)).astype(np.float32) * 0.2
    _weight("l2", w2, 1, nodes, inits)
    nodes.append(helper.make_node("MatMul", ["hd", "l2_w"], ["z"]))
    _q("out", "z", 0.05, 128, "y", nodes, inits)
    return _model(nodes, inits, [6, 32], "y"), {"x": rng.standard_normal(
        (6, 32)).astype(np.float32)}, 2, 0.05


def compile_library(model):
    import tvm

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    target = host_target().to_tvm()
    cfg = pipeline.PipelineConfig(dispatch="library")
    optimized = pipeline.optimize(import_onnx(model).mod, target, cfg, until="dispatch")
    mod = optimized.mod
    return mod, pipeline.build(mod, target, cfg=cfg, start_after="dispatch"), optimized.records


@pytest.mark.parametrize("case", [qdq_cnn, qdq_mlp], ids=["conv", "matmul"])
def test_qdq_chain_is_one_int8_call_and_matches_onnxruntime(case):
    import tvm
    from tvm import relax

    model, inputs, calls, out_scale = case()
    mod, ex, records = compile_library(model)
    text = mod.script(show_meta=False)
    func = od.QCONV_FUNC if case is qdq_cnn else od.QMATMUL_FUNC
    assert text.count(f'R.call_dps_packed("{func}"') == calls
    assert od.CONV_FUNC + '"' not in text and od.MATMUL_FUNC + '"' not in text
    assert all(c.quantized and c.precision == "int8" for c in records.choices)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for _ in range(2):  # the second run hits the cached primitive and reordered weights
        got = vm["main"](*[tvm.runtime.tensor(v) for v in inputs.values()]).numpy()
        # Rounding ties may land one step apart, and one step can move the next layer's input.
        steps = np.abs(got - ref) / out_scale
        assert steps.max() <= 2.01, f"{steps.max():.2f} output quantization steps apart"
        assert (steps > 0.5).mean() < 0.05


def test_without_vnni_the_qdq_graph_keeps_fp32_library_kernels(monkeypatch):
    from tvmopt.targets import registry

    monkeypatch.setattr(registry, "host_cpu_features", lambda: {"avx2", "fma"})
    model, _, _, _ = qdq_cnn()
    mod, _, records = compile_library(model)
    text = mod.script(show_meta=False)
    assert od.QCONV_FUNC not in text and text.count(f'"{od.CONV_FUNC}"') == 3
    assert any("int8 dot-product" in n for n in records.notes)


def test_decision_reports_int8_chosen_for_the_library_workloads():
    from tvmopt.precision.schemes import SCHEMES, Context
    from tvmopt.precision.choice import Choice
    from tvmopt.targets.registry import get_target

    hw = get_target("x86-sapphirerapids")
    lib = [Choice("qconv2d_bias|a", 2, "library", 0.1, 0.3, precision="int8", quantized=True),
           Choice("qconv2d_bias|b", 1, "codegen", 0.3, 0.2, quantized=True),
           Choice("conv2d|c", 1, "library", 0.1, 0.3)]
    ctx = Context(hw, [], "auto", library=lib)
    SCHEMES["int8-qdq"].consider(ctx)
    (d,) = ctx.decisions
    assert d.action == "chosen" and d.precision == "int8"
    assert "int8 compute chosen for 1 of 2" in d.reason and "2 call site(s)" in d.reason
    ctx = Context(hw, [], "auto", library=lib[1:])
    SCHEMES["int8-qdq"].consider(ctx)
    assert ctx.decisions[0].action == "refused" and "faster on none" in ctx.decisions[0].reason


def test_int8_groups_given_back_to_codegen_leave_the_qdq_graph_as_it_was():
    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    model, _, _, _ = qdq_cnn()
    cfg = pipeline.PipelineConfig(dispatch="library")
    mod = pipeline.optimize(import_onnx(model).mod, host_target().to_tvm(), cfg, until="layout").mod
    before = mod["main"].script(show_meta=False)
    part = od.partition(mod, int8=True)
    assert len(od.composites(part)) == 3
    after = od.lower(part, keep=set())["main"].script(show_meta=False)
    # No weight dequantized at run time, and one quantize per pair (the private copies merged).
    assert 'dtype="int8"' not in after
    assert after.count("R.quantize(") == before.count("R.quantize(")


def qdq_resnet(tmp_path):
    """A small ResNet-like CNN (stem, two residual blocks, a strided conv) through onnxruntime's
    own `quantize_static` (QDQ, per-channel int8 weights, u8 activations)."""
    torch = pytest.importorskip("torch")
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c1 = torch.nn.Conv2d(c, c, 3, padding=1)
            self.c2 = torch.nn.Conv2d(c, c, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.c2(torch.relu(self.c1(x))) + x)

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), Block(16),
                              Block(16), torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)).eval()
    shape = (1, 3, 16, 16)
    f32, q = tmp_path / "m.onnx", tmp_path / "q.onnx"
    torch.onnx.export(net, (torch.randn(*shape),), str(f32), input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": np.random.default_rng(i).standard_normal(shape).astype(
                np.float32)} for i in range(4)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(f32), str(q), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    import onnx

    return onnx.load(str(q)), {"x": rng.standard_normal(shape).astype(np.float32)}


def test_qdq_resnet_stays_channels_last_and_joins_residuals_in_the_int8_call(tmp_path):
    import tvm
    from tvm import relax

    model, inputs = qdq_resnet(tmp_path)
    mod, ex, _ = compile_library(model)
    text = mod["main"].script(show_meta=False)
    assert text.count(f'R.call_dps_packed("{od.QCONV_FUNC}"') == 6
    # The input's transpose is folded into the first int8 call; the output's is the graph's
    # own layout boundary. Before the QDQ pairs went through ConvertLayout there were 6.
    assert text.count("R.permute_dims") == 1
    # Both residual joins are sum post-ops of the second conv of their block.
    assert "R.add(" not in text
    out_q = next(n for n in reversed(model.graph.node) if n.op_type == "QuantizeLinear")
    scale = float(next(numpy_helper.to_array(i) for i in model.graph.initializer
                       if i.name == out_q.input[1]))
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(inputs["x"])).numpy()
    assert np.abs(got - ref).max() / scale <= 2.01


def test_consecutive_int8_convs_pass_8bit_tensors_and_match_onnxruntime(tmp_path):
    """MobileNet-style QDQ chain (quantize_static): each convolution's output quantize is folded
    into its int8 call (u8 out), the next call reads that u8 tensor, the graph input's quantize
    goes into the first call: no quantize / dequantize kernel between the convolutions."""
    import onnx
    import tvm
    from tvm import relax

    from tests.models import qdq_depthwise_cnn

    path = qdq_depthwise_cnn(tmp_path)
    model = onnx.load(path)
    mod, ex, records = compile_library(model)
    text = mod["main"].script(show_meta=False)
    calls = [ln for ln in text.splitlines() if f'"{od.QCONV_FUNC}"' in ln]
    assert len(calls) == sum(n.op_type == "Conv" for n in model.graph.node) == 4
    assert all('dtype="uint8"))' in ln for ln in calls)  # every one writes u8
    assert calls[0].count("(x,") == 1  # the graph input, quantized in the call
    # Left to TVM: the dequantize before the pooling and the output's QDQ pair only.
    assert text.count("R.quantize(") == 1 and text.count("R.dequantize(") == 2
    assert all(c.quantized and c.precision == "int8" for c in records.choices)
    inputs = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    out_q = next(n for n in reversed(model.graph.node) if n.op_type == "QuantizeLinear")
    scale = float(next(numpy_helper.to_array(i) for i in model.graph.initializer
                       if i.name == out_q.input[1]))
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for _ in range(2):  # the second run hits the cached primitives
        got = vm["main"](tvm.runtime.tensor(inputs["x"])).numpy()
        steps = np.abs(got - ref) / scale
        assert steps.max() <= 2.01, f"{steps.max():.2f} output quantization steps apart"


def test_8bit_chain_given_back_to_codegen_is_the_qdq_graph_again(tmp_path):
    import onnx

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    from tests.models import qdq_depthwise_cnn

    model = onnx.load(qdq_depthwise_cnn(tmp_path))
    cfg = pipeline.PipelineConfig(dispatch="library")
    mod = pipeline.optimize(import_onnx(model).mod, host_target().to_tvm(), cfg, until="layout").mod
    before = mod["main"].script(show_meta=False)
    part = od.partition(mod, int8=True)
    names = sorted(str(f.attrs["Composite"]) for f in od.composites(part).values())
    assert sum(n.startswith("tvmopt_onednn.qconv2d_u8") and n.endswith("_q") for n in names) == 4
    after = od.lower(part, keep=set())["main"].script(show_meta=False)
    assert 'dtype="int8"' not in after
    assert after.count("R.quantize(") == before.count("R.quantize(")
    assert after.count("R.dequantize(") == before.count("R.dequantize(")
