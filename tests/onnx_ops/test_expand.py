"""Expand with its shape fed at run time follows the broadcast rules (a 1 keeps the input dim)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator


def test_expand_run_time_shape_broadcasts_both_ways():
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import build_in_memory, run_executable

    node = helper.make_node("Expand", ["x", "shape"], ["y"])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    ex = build_in_memory(import_onnx(model).mod)
    x = np.arange(3, dtype="float32").reshape(3, 1)
    for shape in ([2, 1, 6], [1, 3, 1], [4, 3, 2]):  # one build, any shape value
        feeds = {"x": x, "shape": np.array(shape, "int64")}
        want = ReferenceEvaluator(model).run(None, feeds)[0]
        got = run_executable(ex, [x, feeds["shape"]])[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
