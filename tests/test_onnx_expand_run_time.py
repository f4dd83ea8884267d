"""Expand with its shape fed at run time follows the broadcast rules (a 1 keeps the input dim)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator


def test_expand_run_time_shape_broadcasts_both_ways():
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.targets import registry as targets
    from tvmopt.frontend.importer import import_onnx

    node = helper.make_node("Expand", ["x", "shape"], ["y"])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    ex = pipeline.build(import_onnx(model).mod, targets.get_target("x86").to_tvm(), "cpu")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = np.arange(3, dtype="float32").reshape(3, 1)
    for shape in ([2, 1, 6], [1, 3, 1], [4, 3, 2]):  # one build, any shape value
        feeds = {"x": x, "shape": np.array(shape, "int64")}
        want = ReferenceEvaluator(model).run(None, feeds)[0]
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(feeds["shape"])).numpy()
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
