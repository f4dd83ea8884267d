"""Operands of an elementwise op whose equal dims are spelled differently (a convolution's
output length `(n - 10) // 5 + 1` beside the same length computed by the graph with ONNX's
truncating integer Div, as wav2vec2's feature encoder is exported by the dynamo exporter) keep
a known shape, so the reshape that follows imports."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP, helper

from tests.harness import check_against_reference
from tests.models import conv_length_nodes


def test_add_of_one_length_written_two_ways_keeps_its_shape():
    c = helper.make_tensor
    i64 = TP.INT64
    nodes, inits = conv_length_nodes()
    nodes += [
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
        helper.make_node("Unsqueeze", ["len", "ax"], ["len1"]),
        helper.make_node("Concat", ["b1", "four", "len1"], ["shape"], axis=0),
        helper.make_node("ConstantOfShape", ["shape"], ["y2"],
                         value=c("v", TP.FLOAT, [1], [1.5])),
        helper.make_node("Add", ["y", "y2"], ["z"]),
        helper.make_node("Reshape", ["z", "flat"], ["out"]),
    ]
    inits += [c("zero", i64, [], [0]), c("ax", i64, [1], [0]), c("four", i64, [1], [4]),
              c("flat", i64, [2], [0, -1])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 1, "samples"])],
        [helper.make_tensor_value_info("out", TP.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    rng = np.random.default_rng(0)
    for batch, samples in [(2, 400), (1, 123)]:
        check_against_reference(model, {"x": rng.standard_normal((batch, 1, samples))
                                        .astype(np.float32)})
