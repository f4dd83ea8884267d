"""Scan and Loop: unrolled when static, refused by name otherwise.

Each case is a small ONNX graph built by tvmopt for the host CPU (in memory) and compared
with `onnx.reference.ReferenceEvaluator` or onnxruntime.
"""

from __future__ import annotations

from __future__ import annotations
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvmopt.errors import TvmoptError
from tests.harness import run_onnxruntime, run_tvmopt
from tests.models import node_model



# ---------------------------------------------------------------- Scan / Loop

def _scan_body():
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Add", ["sum_in", "next"], ["sum_out"]),
             helper.make_node("Mul", ["next", "sum_out"], ["scan_out"])]
    return helper.make_graph(nodes, "body",
                             [helper.make_tensor_value_info("sum_in", f, [2]),
                              helper.make_tensor_value_info("next", f, [2])],
                             [helper.make_tensor_value_info("sum_out", f, [2]),
                              helper.make_tensor_value_info("scan_out", f, [2])])


@pytest.mark.parametrize("axes,directions", [
    ({}, {}),
    ({"scan_input_axes": [1], "scan_output_axes": [1]},
     {"scan_input_directions": [1], "scan_output_directions": [1]}),
])
def test_scan_unrolled_matches_onnxruntime(axes, directions):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 2) if not axes else (2, 3)).astype(np.float32)
    feeds = {"init": rng.standard_normal(2).astype(np.float32), "x": x}
    node = helper.make_node("Scan", ["init", "x"], ["y", "z"], body=_scan_body(),
                            num_scan_inputs=1, **axes, **directions)
    model = node_model(node, feeds, {}, ["y", "z"], opset=16, out_type=TensorProto.FLOAT)
    # onnx.reference implements no reversed directions: compare with onnxruntime.
    for g, e in zip(run_tvmopt(model, feeds), run_onnxruntime(model, feeds), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6)


def _loop_model(trip_count_const: bool):
    f, i64, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=f),
         helper.make_node("Mul", ["acc_in", "i_f"], ["scaled"]),
         helper.make_node("Add", ["scaled", "x"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["each"])],
        "body",
        [helper.make_tensor_value_info("i", i64, []), helper.make_tensor_value_info("cond_in", b, []),
         helper.make_tensor_value_info("acc_in", f, [3])],
        [helper.make_tensor_value_info("cond_out", b, []),
         helper.make_tensor_value_info("acc_out", f, [3]),
         helper.make_tensor_value_info("each", f, [3])])
    node = helper.make_node("Loop", ["M", "", "acc0"], ["acc", "all"], body=body)
    feeds = {"x": np.array([1.0, -2.0, 0.5], np.float32), "acc0": np.ones(3, np.float32)}
    consts = {"M": np.array(4, np.int64)}
    if not trip_count_const:
        feeds = {"M": consts.pop("M"), **feeds}
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()]
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("acc", f, None),
                               helper.make_tensor_value_info("all", f, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 10
    return model, feeds


def test_loop_with_constant_trip_count_unrolled():
    model, feeds = _loop_model(trip_count_const=True)
    want = run_onnxruntime(model, feeds)  # onnx.reference fails on a Loop without `cond`
    got = run_tvmopt(model, feeds)
    assert got[1].shape == (4, 3)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6)


def test_loop_with_runtime_trip_count_is_refused():
    from tvmopt.frontend.importer import import_onnx

    model, _ = _loop_model(trip_count_const=False)
    with pytest.raises(TvmoptError, match="Loop.*trip count M is computed at run time"):
        import_onnx(model)
