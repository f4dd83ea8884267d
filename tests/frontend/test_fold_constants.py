"""Shape-aware constant folding before import leaves alone what would be a large constant, and
never builds it to find out: a few-element shape can ask for gigabytes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

from tvmopt.frontend.onnx_ops import preprocess


def _model(nodes, inits):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in ("big", "small")],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("op,operands", [
    ("ConstantOfShape", {"shape": np.array([1 << 20, 1 << 20], np.int64)}),
    ("Expand", {"one": np.ones((1, 1), np.float32), "shape": np.array([1 << 20, 1 << 20],
                                                                       np.int64)}),
    ("Tile", {"one": np.ones((1, 1), np.float32), "shape": np.array([1 << 20, 1 << 20],
                                                                     np.int64)}),
    ("Range", {"zero": np.array(0.0, np.float32), "shape": np.array(1e12, np.float32),
               "one": np.array(1.0, np.float32)}),
])
def test_an_output_larger_than_the_fold_limit_is_not_evaluated(op, operands, monkeypatch):
    evaluated = []
    real = preprocess._evaluate

    def spy(node, values, opset):
        evaluated.append(node.op_type)
        return real(node, values, opset)

    monkeypatch.setattr(preprocess, "_evaluate", spy)
    names = {"ConstantOfShape": ["shape"], "Expand": ["one", "shape"], "Tile": ["one", "shape"],
             "Range": ["zero", "shape", "one"]}[op]
    nodes = [helper.make_node(op, names, ["big"]),
             helper.make_node("ConstantOfShape", ["four"], ["small"],
                              value=helper.make_tensor("v", TP.FLOAT, [1], [2.0]))]
    model = _model(nodes, {**operands, "four": np.array([2, 2], np.int64)})
    out = preprocess.fold_constants(model)
    assert evaluated == ["ConstantOfShape"]  # the small one only
    ops = {n.output[0]: n.op_type for n in out.graph.node}
    assert ops == {"big": op, "small": "Constant"}
