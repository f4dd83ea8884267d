"""Small ops: dtypes, attributes and edge values (Celu, Elu, IsInf, Mod, BitShift, Mish, EyeLike, MaxPool indices).

Each case is a small ONNX graph built by tvmopt for the host CPU (in memory) and compared
with `onnx.reference.ReferenceEvaluator` or onnxruntime.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np
import pytest
from onnx import TensorProto, helper
from tests.harness import check_against_reference
from tests.models import graph_model



# ---- Small ops: dtypes, attributes and edge values ----------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_celu_and_elu_keep_dtype(dtype):
    feeds = {"x": np.array([-3.0, -0.5, 0.0, 0.7, 2.0], dtype=dtype)}
    for op in ("Celu", "Elu"):
        node = helper.make_node(op, ["x"], ["y"], alpha=2.0)
        check_against_reference(graph_model(node, feeds, ["y"], opset=12), feeds, rtol=1e-3)


@pytest.mark.parametrize("pos,neg", [(1, 0), (0, 1), (0, 0)])
def test_isinf_detect_attributes(pos, neg):
    feeds = {"x": np.array([-np.inf, np.inf, np.nan, 1.0], dtype=np.float32)}
    node = helper.make_node("IsInf", ["x"], ["y"], detect_positive=pos, detect_negative=neg)
    check_against_reference(graph_model(node, feeds, ["y"], opset=20), feeds)


def test_mod_float_python_semantics_edge_values():
    a = np.array([5.0, -5.0, 5.0, -5.0, 0.0, 7.5, -7.5, 3.0], dtype=np.float32)
    b = np.array([np.inf, np.inf, -np.inf, 3.0, 2.0, -2.0, 2.0, 0.0], dtype=np.float32)
    feeds = {"a": a, "b": b}
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=0)
    check_against_reference(graph_model(node, feeds, ["y"], opset=13), feeds)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bitshift_out_of_range_amounts(direction):
    feeds = {"a": np.array([16, -16, 3, 1], dtype=np.int32),
             "b": np.array([-1, 33, 32, 2], dtype=np.int32)}
    node = helper.make_node("BitShift", ["a", "b"], ["y"], direction=direction)
    check_against_reference(graph_model(node, feeds, ["y"], opset=11), feeds)


def test_mish_keeps_tiny_values_of_very_negative_inputs():
    x = np.array([-30.0, -17.0, -5.0, 0.0, 3.0, 40.0], dtype=np.float32)
    feeds = {"x": x}
    for op in ("Mish", "Softplus"):
        node = helper.make_node(op, ["x"], ["y"])
        got = check_against_reference(graph_model(node, feeds, ["y"], opset=18), feeds, rtol=1e-5, atol=1e-12)[0]
        assert np.all(np.isfinite(got))


def test_eyelike_dtype_attribute():
    feeds = {"x": np.zeros((3, 4), dtype=np.int32)}
    node = helper.make_node("EyeLike", ["x"], ["y"], dtype=TensorProto.DOUBLE, k=1)
    check_against_reference(graph_model(node, feeds, ["y"], opset=9), feeds)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
    {"kernel_shape": [2, 2], "strides": [2, 2], "storage_order": 1, "ceil_mode": 1},
])
def test_maxpool_indices_output(attrs):
    x = np.random.default_rng(9).standard_normal((1, 2, 5, 5)).astype(np.float32)
    x[0, 0, 0, :2] = 7.0  # a tie: the first in window order wins
    feeds = {"x": x}
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    check_against_reference(graph_model(node, feeds, ["y", "i"], opset=12), feeds)
