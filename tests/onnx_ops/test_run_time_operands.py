"""Operands given at run time (axes, starts, pads, split sizes, k, depth) instead of constants.

Each case is a small ONNX graph built by tvmopt for the host CPU (in memory) and compared
with `onnx.reference.ReferenceEvaluator` or onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from tests.harness import check_single_output, run_tvmopt
from tests.models import single_output_model



# ---- operands given at run time ------------------------------------------------------------

@pytest.mark.parametrize("op,axes,keep", [
    ("ReduceSum", [-2], 1), ("ReduceMean", [0, 2], 0), ("ReduceLogSumExp", [1], 0),
    ("ReduceMax", [2, 0], 1), ("ReduceL2", [0, 1, 2], 0),
])
def test_reduce_axes_fed_at_run_time(op, axes, keep):
    x = np.random.default_rng(3).standard_normal((3, 2, 4)).astype("float32")
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keep)
    got = check_single_output(node, {"x": x, "axes": np.array(axes, "int64")}, opset=18)
    assert got.ndim == (3 if keep else 3 - len(axes))


def test_reduce_run_time_axes_artifact_takes_other_axes():
    """The same artifact, fed other axes, gives that reduction: the shape follows the input."""
    x = np.random.default_rng(4).standard_normal((3, 2, 4)).astype("float32")
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    model = single_output_model(node, {"x": x, "axes": np.array([0], "int64")}, {}, opset=18)
    for axes in ([0], [2], [-2]):
        got = run_tvmopt(model, {"x": x, "axes": np.array(axes, "int64")})[0]
        np.testing.assert_allclose(got, x.sum(axis=tuple(axes)), rtol=1e-5, atol=1e-5)


def test_slice_operands_fed_at_run_time():
    x = np.random.default_rng(5).standard_normal((20, 10, 5)).astype("float32")
    node = helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])
    feeds = {"x": x, "starts": np.array([20, 1], "int64"), "ends": np.array([0, 1000], "int64"),
             "axes": np.array([0, -2], "int64"), "steps": np.array([-3, 2], "int64")}
    model = single_output_model(node, feeds, {}, opset=13)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_array_equal(run_tvmopt(model, feeds)[0], want)
    # the same artifact, other operands: shape and values follow them
    feeds.update(starts=np.array([-4, 0], "int64"), ends=np.array([-1, 3], "int64"),
                 steps=np.array([1, 1], "int64"))
    np.testing.assert_array_equal(run_tvmopt(model, feeds)[0], x[-4:-1, 0:3])


def test_unsqueeze_axes_fed_at_run_time():
    x = np.random.default_rng(6).standard_normal((3, 4)).astype("float32")
    node = helper.make_node("Unsqueeze", ["x", "axes"], ["y"])
    got = check_single_output(node, {"x": x, "axes": np.array([3, 0], "int64")}, opset=13)
    assert got.shape == (1, 3, 4, 1)


@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_axes_of_unknown_length_empty_at_run_time(noop):
    """A declared-empty axes input (TVM imports its length as symbolic): all axes, or none."""
    x = np.random.default_rng(7).standard_normal((3, 2, 2)).astype("float32")
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1,
                            noop_with_empty_axes=noop)
    check_single_output(node, {"x": x, "axes": np.array([], "int64")}, opset=18)


def test_reduce_max_bool():
    x = np.array([[True, False], [False, False]])
    node = helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=0)
    check_single_output(node, {"x": x}, {"axes": np.array([1], "int64")}, out_dtype=TensorProto.BOOL)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_operands_fed_at_run_time(mode):
    x = np.random.default_rng(8).standard_normal((3, 4)).astype("float32")
    names = ["x", "pads", "value", "axes"] if mode == "constant" else ["x", "pads", "", "axes"]
    node = helper.make_node("Pad", names, ["y"], mode=mode)
    feeds = {"x": x, "pads": np.array([2, 0, 1, 2], "int64")}
    if mode == "constant":
        feeds["value"] = np.array(1.5, "float32")
    feeds["axes"] = np.array([-1, 0], "int64")
    check_single_output(node, feeds, opset=19)


def test_split_sizes_fed_at_run_time():
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import build_in_memory, run_executable

    x = np.arange(24, dtype="float32").reshape(2, 12)
    node = helper.make_node("Split", ["x", "split"], ["a", "b", "c"], axis=-1)
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abc"]
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 12]),
        helper.make_tensor_value_info("split", TensorProto.INT64, [3])], outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    ex = build_in_memory(import_onnx(model).mod)  # one build, several split sizes
    for sizes in ([2, 3, 7], [12, 0, 0]):
        got = run_executable(ex, [x, np.array(sizes, "int64")])
        want = np.split(x, np.cumsum(sizes)[:-1], axis=1)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("axis", [0, -1])
def test_cumsum_axis_fed_at_run_time(axis):
    x = np.random.default_rng(9).standard_normal((3, 4)).astype("float32")
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], reverse=1, exclusive=1)
    check_single_output(node, {"x": x, "axis": np.array(axis, "int64")}, opset=14)


@pytest.mark.parametrize("k_const", [True, False])
def test_topk_k_constant_or_fed_at_run_time(k_const):
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import build_in_memory, run_executable

    x = np.array([[3, 1, 3, 2, 0], [5, 5, 4, 1, 5]], "float32")  # ties: lower index first
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1, largest=1)
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])]
    inits = [numpy_helper.from_array(np.array([3], "int64"), "k")] if k_const else []
    if not k_const:
        ins.append(helper.make_tensor_value_info("k", TensorProto.INT64, [1]))
    outs = [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("i", TensorProto.INT64, None)]
    model = helper.make_model(helper.make_graph([node], "g", ins, outs, initializer=inits),
                              opset_imports=[helper.make_opsetid("", 11)])
    ex = build_in_memory(import_onnx(model).mod)
    for k in ([3] if k_const else [3, 1]):
        feeds = {"x": x} if k_const else {"x": x, "k": np.array([k], "int64")}
        want = ReferenceEvaluator(model).run(None, feeds)
        got = run_executable(ex, list(feeds.values()))
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_onehot_depth_fed_at_run_time():
    idx = np.array([[1, -1], [0, 3]], "int64")
    node = helper.make_node("OneHot", ["i", "depth", "values"], ["y"], axis=1)
    feeds = {"i": idx, "depth": np.array(4, "int64"), "values": np.array([-2, 7], "int64")}
    got = check_single_output(node, feeds, out_dtype=TensorProto.INT64, opset=11)
    assert got.shape == (2, 4, 2)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceProd", "ReduceLogSumExp", "ReduceSum"])
def test_reduce_run_time_axes_over_empty_set_gives_identity(op):
    x = np.zeros((2, 0, 4), "float32")
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)
    got = check_single_output(node, {"x": x, "axes": np.array([1], "int64")}, opset=18)
    assert got.shape == (2, 1, 4)
