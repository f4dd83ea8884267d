"""Importer round three: Attention precision and masks, run-time Resize, symbolic-dim ordering,
and small-op edge values.

Each case is one small ONNX graph (or a torch export), built by tvmopt for llvm and compared
with `onnx.reference.ReferenceEvaluator` (the spec's own implementation) or onnxruntime.
"""

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

def _model(nodes, feeds: dict, outputs, consts=None, opset=19):
    nodes = nodes if isinstance(nodes, list) else [nodes]
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    inits = [numpy_helper.from_array(v, k) for k, v in (consts or {}).items()]
    outs = [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None) for name in outputs]
    graph = helper.make_graph(nodes, "g", inputs, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run_tvmopt(model, feeds: dict, dims=None) -> list:
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.targets import registry as targets
    from tvmopt.frontend.importer import import_onnx

    imported = import_onnx(model)
    ex = pipeline.build(imported.mod, targets.get_target("x86").to_tvm(), "cpu")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    outs = [out] if hasattr(out, "numpy") else list(out)
    return [o.numpy() for o in outs]


def _check(model, feeds, rtol=1e-5, atol=1e-6):
    want = ReferenceEvaluator(model).run(None, feeds)
    got = _run_tvmopt(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g.astype("float64"), w.astype("float64"), rtol=rtol, atol=atol)
    return got


# ---- 1. Attention: float16/bfloat16 rounding, masks, windows, external KV cache -------------

def _attention(feeds, attrs, opset, n_out=1, names=("Q", "K", "V")):
    outs = ["Y", "present_key", "present_value", "qk"][:n_out]
    node = helper.make_node("Attention", list(names), outs, **attrs)
    return _model(node, feeds, outs, opset=opset)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_attention_low_precision_causal_matches_reference_exactly(dtype):
    # The reference accumulates matmuls in float32 and rounds softmax steps to the input type;
    # TVM's float16 accumulators drifted 1-8 ulps, which the cases' rtol=1e-3 rejects.
    rng = np.random.default_rng(0)
    feeds = {k: rng.random(shape).astype(dtype)
             for k, shape in (("Q", (2, 3, 4, 8)), ("K", (2, 3, 6, 8)), ("V", (2, 3, 6, 8)))}
    model = _attention(feeds, {"is_causal": 1}, 23)
    want = ReferenceEvaluator(model).run(None, feeds)[0].astype("float32")
    got = _run_tvmopt(model, feeds)[0].astype("float32")
    # bfloat16: same up to rounding of fused intermediates; float16: within 1 ulp
    ulp = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-3)) <= ulp + 1e-6


def test_attention_fully_masked_row_is_zero_and_mode2_keeps_minus_inf():
    rng = np.random.default_rng(1)
    feeds = {"Q": rng.random((1, 2, 3, 4), dtype=np.float32),
             "K": rng.random((1, 2, 5, 4), dtype=np.float32),
             "V": rng.random((1, 2, 5, 4), dtype=np.float32),
             "mask": np.array([[True] * 5, [False] * 5, [True, False, True, False, True]])}
    model = _attention(feeds, {"qk_matmul_output_mode": 2}, 23, n_out=4,
                       names=("Q", "K", "V", "mask"))
    y, _, _, qk = _check(model, feeds)
    assert np.all(y[:, :, 1] == 0) and np.all(np.isneginf(qk[:, :, 1]))


@pytest.mark.parametrize("left,right,causal", [(2, -1, 1), (1, 1, 0), (-1, 0, 0)])
def test_attention_sliding_window(left, right, causal):
    rng = np.random.default_rng(2)
    feeds = {k: rng.random((1, 2, 6, 4), dtype=np.float32) for k in ("Q", "K", "V")}
    _check(_attention(feeds, {"left_window_size": left, "right_window_size": right,
                              "is_causal": causal}, 25), feeds)


def test_attention_nonpad_kv_seqlen_decode_with_gqa_and_window():
    # A static KV buffer of 8 with 5 and 3 valid keys; one decode query per batch.
    rng = np.random.default_rng(3)
    feeds = {"Q": rng.random((2, 4, 1, 8), dtype=np.float32),
             "K": rng.random((2, 2, 8, 8), dtype=np.float32),
             "V": rng.random((2, 2, 8, 8), dtype=np.float32),
             "nonpad": np.array([5, 3], dtype=np.int64)}
    node = helper.make_node("Attention", ["Q", "K", "V", "", "", "", "nonpad"], ["Y"],
                            is_causal=1, left_window_size=2)
    _check(_model(node, feeds, ["Y"], opset=25), feeds)


def test_torch_sdpa_fp16_causal_export_matches_reference():
    # What exporters write for F.scaled_dot_product_attention: MatMul -> Softmax -> MatMul in
    # float16, which tvmopt now rounds like the reference (float32 accumulation).
    torch = pytest.importorskip("torch")
    import io

    class SDPA(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    rng = np.random.default_rng(4)
    qkv = [rng.standard_normal((1, 2, 8, 16)).astype("float16") for _ in range(3)]
    buf = io.BytesIO()
    torch.onnx.export(SDPA(), tuple(torch.from_numpy(a) for a in qkv), buf, dynamo=False,
                      opset_version=17, input_names=["q", "k", "v"])
    model = onnx.load_from_string(buf.getvalue())
    assert {"MatMul", "Softmax"} <= {n.op_type for n in model.graph.node}
    feeds = dict(zip(["q", "k", "v"], qkv))
    want = ReferenceEvaluator(model).run(None, feeds)[0].astype("float32")
    got = _run_tvmopt(model, feeds)[0].astype("float32")
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    exact = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a.astype("float32")) for a in qkv), is_causal=True).numpy()
    np.testing.assert_allclose(got, exact, rtol=1e-2, atol=5e-3)


# ---- 2. Reductions over all -inf, symbolic dims defined by match_cast -----------------------

def test_reduce_max_of_only_minus_inf_is_minus_inf():
    x = np.array([[-np.inf, -np.inf], [1.0, -np.inf]], dtype=np.float32)
    feeds = {"x": x}
    node = helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=0)
    got = _check(_model(node, feeds, ["y"], consts={"axes": np.array([1])}), feeds)[0]
    assert np.isneginf(got[0]) and got[1] == 1.0


def test_reduce_min_with_run_time_axes_builds():
    # run-time axes bind fresh dims in a match_cast; FuseOps used to emit a kernel before it
    feeds = {"x": np.array([[np.inf, np.inf], [1.0, 2.0]], dtype=np.float32),
             "axes": np.array([1], dtype=np.int64)}
    node = helper.make_node("ReduceMin", ["x", "axes"], ["y"], keepdims=1)
    got = _check(_model(node, feeds, ["y"]), feeds)[0]
    assert np.isposinf(got[0, 0])


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
def test_window_with_run_time_size_builds(op):
    feeds = {"size": np.array(10, dtype=np.int32)}
    node = helper.make_node(op, ["size"], ["y"], periodic=0)
    _check(_model(node, feeds, ["y"], opset=17), feeds)


# ---- 3. Resize with operands given at run time ----------------------------------------------

@pytest.mark.parametrize("attrs,scales", [
    ({"mode": "linear"}, [1.0, 1.0, 0.6, 1.7]),
    ({"mode": "cubic", "antialias": 1}, [1.0, 1.0, 0.5, 0.75]),
    ({"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, [1.0, 1.0, 1.5, 2.0]),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil",
      "coordinate_transformation_mode": "asymmetric"}, [1.0, 1.0, 2.5, 0.5]),
])
def test_resize_run_time_scales(attrs, scales):
    rng = np.random.default_rng(5)
    feeds = {"x": rng.random((1, 2, 4, 6), dtype=np.float32),
             "scales": np.array(scales, dtype=np.float32)}
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    _check(_model(node, feeds, ["y"]), feeds)


def test_resize_run_time_sizes_keep_aspect_and_roi():
    rng = np.random.default_rng(6)
    feeds = {"x": rng.random((1, 1, 4, 5), dtype=np.float32),
             "sizes": np.array([7, 9], dtype=np.int64)}
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear", axes=[2, 3],
                            keep_aspect_ratio_policy="not_larger")
    _check(_model(node, feeds, ["y"]), feeds)
    feeds = {"x": feeds["x"], "roi": np.array([0.2, -0.1, 0.9, 1.3], dtype=np.float32),
             "sizes": np.array([3, 6], dtype=np.int64)}
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="linear",
                            axes=[2, 3], coordinate_transformation_mode="tf_crop_and_resize",
                            extrapolation_value=-1.0)
    _check(_model(node, feeds, ["y"]), feeds)


def test_resize_one_artifact_runs_other_scales():
    # The output shape is bound when the artifact runs: one build, two different scales.
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.targets import registry as targets
    from tvmopt.frontend.importer import import_onnx

    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    model = _model(node, {"x": x, "scales": np.ones(4, np.float32)}, ["y"])
    ex = pipeline.build(import_onnx(model).mod, targets.get_target("x86").to_tvm(), "cpu")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for scales in ([1, 1, 2, 2], [1, 1, 1, 0.5]):
        s = np.array(scales, dtype=np.float32)
        want = ReferenceEvaluator(model).run(None, {"x": x, "scales": s})[0]
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(s)).numpy()
        np.testing.assert_array_equal(got, want)


def test_torch_upsample_to_skip_size_with_dynamic_batch():
    # U-Net/FPN style: F.interpolate(x, size=y.shape[-2:]) exports sizes as
    # Concat(Shape(x)[:2], Shape(y)[2:]); with a symbolic batch that is a symbolic shape.
    torch = pytest.importorskip("torch")
    import io

    class Up(torch.nn.Module):
        def forward(self, x, y):
            return torch.nn.functional.interpolate(x, size=y.shape[-2:], mode="bilinear") + y

    x, y = torch.randn(2, 3, 5, 6), torch.randn(2, 3, 10, 12)
    buf = io.BytesIO()
    torch.onnx.export(Up(), (x, y), buf, dynamo=False, opset_version=18, input_names=["x", "y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    model = onnx.load_from_string(buf.getvalue())
    assert "Shape" in {n.op_type for n in model.graph.node}
    feeds = {"x": np.random.default_rng(7).random((3, 3, 5, 6), dtype=np.float32),
             "y": np.random.default_rng(8).random((3, 3, 10, 12), dtype=np.float32)}
    import onnxruntime as ort

    want = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"]).run(
        None, feeds)[0]
    got = _run_tvmopt(model, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_upsample_opset9_scales_input():
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    feeds = {"x": x, "scales": np.array([1, 1, 2, 3], dtype=np.float32)}
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")
    _check(_model(node, feeds, ["y"], opset=9), feeds)


# ---- 4. Small ops: dtypes, attributes and edge values ----------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_celu_and_elu_keep_dtype(dtype):
    feeds = {"x": np.array([-3.0, -0.5, 0.0, 0.7, 2.0], dtype=dtype)}
    for op in ("Celu", "Elu"):
        node = helper.make_node(op, ["x"], ["y"], alpha=2.0)
        _check(_model(node, feeds, ["y"], opset=12), feeds, rtol=1e-3)


@pytest.mark.parametrize("pos,neg", [(1, 0), (0, 1), (0, 0)])
def test_isinf_detect_attributes(pos, neg):
    feeds = {"x": np.array([-np.inf, np.inf, np.nan, 1.0], dtype=np.float32)}
    node = helper.make_node("IsInf", ["x"], ["y"], detect_positive=pos, detect_negative=neg)
    _check(_model(node, feeds, ["y"], opset=20), feeds)


def test_mod_float_python_semantics_edge_values():
    a = np.array([5.0, -5.0, 5.0, -5.0, 0.0, 7.5, -7.5, 3.0], dtype=np.float32)
    b = np.array([np.inf, np.inf, -np.inf, 3.0, 2.0, -2.0, 2.0, 0.0], dtype=np.float32)
    feeds = {"a": a, "b": b}
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=0)
    _check(_model(node, feeds, ["y"], opset=13), feeds)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_out_of_range_amounts(direction):
    feeds = {"a": np.array([16, -16, 3, 1], dtype=np.int32),
             "b": np.array([-1, 33, 32, 2], dtype=np.int32)}
    node = helper.make_node("BitShift", ["a", "b"], ["y"], direction=direction)
    _check(_model(node, feeds, ["y"], opset=11), feeds)


def test_mish_keeps_tiny_values_of_very_negative_inputs():
    x = np.array([-30.0, -17.0, -5.0, 0.0, 3.0, 40.0], dtype=np.float32)
    feeds = {"x": x}
    for op in ("Mish", "Softplus"):
        node = helper.make_node(op, ["x"], ["y"])
        got = _check(_model(node, feeds, ["y"], opset=18), feeds, rtol=1e-5, atol=1e-12)[0]
        assert np.all(np.isfinite(got))


def test_eyelike_dtype_attribute():
    feeds = {"x": np.zeros((3, 4), dtype=np.int32)}
    node = helper.make_node("EyeLike", ["x"], ["y"], dtype=TensorProto.DOUBLE, k=1)
    _check(_model(node, feeds, ["y"], opset=9), feeds)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
    {"kernel_shape": [2, 2], "strides": [2, 2], "storage_order": 1, "ceil_mode": 1},
])
def test_maxpool_indices_output(attrs):
    x = np.random.default_rng(9).standard_normal((1, 2, 5, 5)).astype(np.float32)
    x[0, 0, 0, :2] = 7.0  # a tie: the first in window order wins
    feeds = {"x": x}
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    _check(_model(node, feeds, ["y", "i"], opset=12), feeds)
