"""Quantized ops (QLinearMatMul, ConvInteger, QLinearConv, rounding) against onnx.reference.

Each case is a small ONNX graph built by tvmopt for the host CPU (in memory) and compared
with `onnx.reference.ReferenceEvaluator` or onnxruntime.
"""

from __future__ import annotations

from __future__ import annotations
import numpy as np
from onnx import TensorProto, helper
import pytest
from tests.harness import check_node, run_onnxruntime, run_tvmopt
from tests.models import graph_model, node_model



# ---------------------------------------------------------------- int8 ops

def test_qlinearmatmul_per_row_and_column_zero_points():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, (3, 5), dtype=np.uint8)
    b = rng.integers(0, 255, (5, 4), dtype=np.uint8)
    feeds = {"a": a, "b": b}
    consts = {"a_scale": np.array([0.02, 0.05, 0.1], np.float32),
              "a_zp": np.array([120, 128, 3], np.uint8),
              "b_scale": np.array([0.01, 0.03, 0.2, 0.04], np.float32),
              "b_zp": np.array([1, 200, 128, 7], np.uint8),
              "y_scale": np.array(0.9, np.float32), "y_zp": np.array(10, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp",
                                              "y_scale", "y_zp"], ["y"])
    # onnx.reference cannot broadcast a per-row [M] zero point; compute the spec by hand.
    c = consts
    acc = (a.astype(np.int32) - c["a_zp"].astype(np.int32)[:, None]) @ \
        (b.astype(np.int32) - c["b_zp"].astype(np.int32))
    want = np.rint(acc * (c["a_scale"][:, None] * c["b_scale"] / c["y_scale"])) + 10
    want = np.clip(want, 0, 255).astype(np.uint8)
    got = run_tvmopt(node_model(node, feeds, consts, ["y"]), feeds)[0]
    np.testing.assert_array_equal(got, want)
    # Negative results occur, so saturation at 0 is exercised too.
    assert got.min() == 0


def test_qlinearmatmul_per_column_zero_point():
    rng = np.random.default_rng(4)
    feeds = {"a": rng.integers(0, 255, (3, 5), dtype=np.uint8)}
    consts = {"a_scale": np.array(0.02, np.float32), "a_zp": np.array(128, np.uint8),
              "b": rng.integers(0, 255, (5, 4), dtype=np.uint8),
              "b_scale": np.array([0.01, 0.03, 0.2, 0.04], np.float32),
              "b_zp": np.array([1, 200, 128, 7], np.uint8),
              "y_scale": np.array(0.3, np.float32), "y_zp": np.array(10, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp",
                                              "y_scale", "y_zp"], ["y"])
    check_node(node, feeds, consts, atol=0)


def test_qlinearmatmul_int8_batched_runtime_scales():
    rng = np.random.default_rng(1)
    feeds = {"a": rng.integers(-128, 127, (2, 3, 6), dtype=np.int8),
             "a_scale": np.array(0.03, np.float32), "a_zp": np.array(-5, np.int8),
             "b": rng.integers(-128, 127, (6, 4), dtype=np.int8),
             "b_scale": np.array(0.02, np.float32), "b_zp": np.array(4, np.int8),
             "y_scale": np.array(0.5, np.float32), "y_zp": np.array(-3, np.int8)}
    node = helper.make_node("QLinearMatMul", list(feeds), ["y"])
    check_node(node, feeds, atol=0)


def test_round_half_to_even():
    # acc * multiplier lands exactly on .5: ONNX rounds to even (2.5 -> 2, 3.5 -> 4).
    feeds = {"a": np.array([[5], [7], [9]], np.uint8)}
    consts = {"a_scale": np.array(1.0, np.float32), "a_zp": np.array(0, np.uint8),
              "b": np.array([[1]], np.uint8),
              "b_scale": np.array(0.5, np.float32), "b_zp": np.array(0, np.uint8),
              "y_scale": np.array(1.0, np.float32), "y_zp": np.array(0, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp",
                                              "y_scale", "y_zp"], ["y"])
    got = check_node(node, feeds, consts, atol=0)
    assert got[0].ravel().tolist() == [2, 4, 4]


def test_convinteger_per_channel_weight_zero_point():
    rng = np.random.default_rng(2)
    feeds = {"x": rng.integers(0, 255, (1, 2, 5, 5), dtype=np.uint8)}
    consts = {"w": rng.integers(0, 255, (3, 2, 3, 3), dtype=np.uint8),
              "x_zp": np.array(100, np.uint8), "w_zp": np.array([1, 128, 250], np.uint8)}
    node = helper.make_node("ConvInteger", ["x", "w", "x_zp", "w_zp"], ["y"], pads=[1, 1, 1, 1])
    check_node(node, feeds, consts, opset=10, atol=0)


def test_qlinearconv_per_channel_scale_and_bias():
    rng = np.random.default_rng(3)
    feeds = {"x": rng.integers(-128, 127, (1, 2, 6, 6), dtype=np.int8)}
    consts = {"x_scale": np.array(0.05, np.float32), "x_zp": np.array(2, np.int8),
              "w": rng.integers(-128, 127, (4, 2, 3, 3), dtype=np.int8),
              "w_scale": np.array([0.01, 0.02, 0.005, 0.03], np.float32),
              "w_zp": np.array([0, 0, 0, 0], np.int8),
              "y_scale": np.array(0.25, np.float32), "y_zp": np.array(-1, np.int8),
              "bias": rng.integers(-500, 500, (4,), dtype=np.int32)}
    node = helper.make_node("QLinearConv", list(["x"] + list(consts)), ["y"],
                            strides=[2, 2], pads=[1, 0, 1, 0])
    check_node(node, feeds, consts, opset=10, atol=0)


# ---------------------------------------------------------------- NaN / inf in QuantizeLinear

def _special_values(n=40):
    x = np.linspace(-3, 3, n).astype(np.float32)
    x[:5] = [np.nan, np.inf, -np.inf, np.nan, 1.0]
    return x.reshape(2, n // 2)


@pytest.mark.parametrize("zp", [np.uint8(0), np.uint8(128), np.int8(0), np.int8(-5)])
@pytest.mark.parametrize("opset", [13, 21])  # 13: TVM's relax.quantize; 21: output_dtype path
def test_quantize_nan_goes_to_the_minimum_and_inf_saturates(zp, opset):
    # onnxruntime, OpenVINO and onnx.reference give NaN -> type minimum (whatever the zero
    # point); TVM's legalization cast the NaN as is (LLVM poison: 255 for uint8 here).
    feeds = {"x": _special_values()}
    consts = {"s": np.array(0.1, np.float32), "z": np.array(zp)}
    qtype = helper.np_dtype_to_tensor_dtype(np.array(zp).dtype)
    attrs = {"output_dtype": qtype} if opset >= 21 else {}
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], **attrs)
    model = node_model(node, feeds, consts, ["y"], opset=opset, out_type=qtype)
    got = run_tvmopt(model, feeds)[0]
    want = run_onnxruntime(model, feeds)[0]
    np.testing.assert_array_equal(got, want)
    lo, hi = np.iinfo(np.array(zp).dtype).min, np.iinfo(np.array(zp).dtype).max
    assert got.ravel()[[0, 1, 2, 3]].tolist() == [lo, hi, lo, lo]


def test_qdq_masked_softmax_with_infinite_scale():
    # onnxruntime's quantize_static of a GPT-2-style decoder: the causal mask's Where outputs
    # -inf, calibration gives it scale = inf, so QDQ(Where) is NaN (0 * inf, -inf / inf), the
    # Softmax is NaN, and its QuantizeLinear must give 0 (onnxruntime) -- tvmopt gave 255, so
    # every attention probability became 1.0 and the model's output was 0.61 off.
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
    mask = np.triu(np.ones((8, 8), bool), 1)
    feeds = {"scores": scores}
    consts = {"mask": mask, "neg": np.array(-np.inf, np.float32),
              "s_inf": np.array(np.inf, np.float32), "z0": np.array(0, np.uint8),
              "s_p": np.array(1 / 255, np.float32)}
    nodes = [helper.make_node("Where", ["mask", "neg", "scores"], ["w"]),
             helper.make_node("QuantizeLinear", ["w", "s_inf", "z0"], ["wq"]),
             helper.make_node("DequantizeLinear", ["wq", "s_inf", "z0"], ["wd"]),
             helper.make_node("Softmax", ["wd"], ["p"], axis=-1),
             helper.make_node("QuantizeLinear", ["p", "s_p", "z0"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "s_p", "z0"], ["y"])]
    model = graph_model(nodes, feeds, ["pq", "y"], consts, opset=17)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.UINT8  # onnxruntime wants
    model.graph.output[1].type.tensor_type.elem_type = TensorProto.FLOAT  # typed outputs
    got = run_tvmopt(model, feeds)
    want = run_onnxruntime(model, feeds)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert not want[1].any()  # all zeros, not all ones
