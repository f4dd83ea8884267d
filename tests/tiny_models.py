"""Tiny ONNX graphs built in the tests (nothing downloaded)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def tiny_mlp(path, batch="batch", features=32, hidden=32, classes=8, seed=0) -> str:
    """x[batch, features] -> MatMul/Add/Relu -> MatMul/Add; two tuning tasks after fusion."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype("float32") * 0.1, n)
             for n, s in [("w1", (features, hidden)), ("b1", (hidden,)),
                          ("w2", (hidden, classes)), ("b2", (classes,))]]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]),
             helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]),
             helper.make_node("MatMul", ["h2", "w2"], ["y0"]),
             helper.make_node("Add", ["y0", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "tiny_mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, classes])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def tiny_conv(path, channels=32, size=28, seed=0) -> str:
    """x[1, 16, size, size] -> Conv3x3+Relu -> Conv1x1: two conv tasks with real weights."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype("float32") * 0.1, n)
             for n, s in [("w1", (channels, 16, 3, 3)), ("b1", (channels,)),
                          ("w2", (channels, channels, 1, 1))]]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h0"], ["h1"]),
             helper.make_node("Conv", ["h1", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "tiny_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)
