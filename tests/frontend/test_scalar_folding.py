"""Arithmetic on scalars read from shapes keeps the graph's dtype: MobileViT's unfold computes
`ceil(H / 2) * 2` in float32 from a static height beside a symbolic batch, which TVM's
converter folded into a float64 scalar ("Binary operators must have the same datatype")."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP, helper

from tests.harness import check_against_reference


def test_float_arithmetic_on_a_static_dim_stays_float32():
    c = helper.make_tensor
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "two"], ["h"], axis=0),
             helper.make_node("Cast", ["h"], ["hf"], to=TP.FLOAT),
             helper.make_node("Div", ["hf", "f2"], ["hd"]),
             helper.make_node("Ceil", ["hd"], ["hc"]),
             helper.make_node("Mul", ["hc", "f2"], ["hm"]),
             helper.make_node("Cast", ["hm"], ["hi"], to=TP.INT64),
             helper.make_node("Sub", ["hi", "h"], ["pad"]),
             helper.make_node("Cast", ["pad"], ["padf"], to=TP.FLOAT),
             helper.make_node("Add", ["x", "padf"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["b", 3, 7, 8])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["b", 3, 7, 8])],
        [c("two", TP.INT64, [], [2]), c("f2", TP.FLOAT, [], [2.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 8)).astype(np.float32)
    check_against_reference(model, {"x": x})
