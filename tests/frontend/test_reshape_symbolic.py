"""A Reshape with a -1 on symbolically shaped tensors (the attention heads' `view(-1, past +
seq, d)` of a decoder with a KV cache, as the dynamo exporter writes it) gets the -1 as the
input's leftover factors (`batch * 4`), not `prod // prod`, which TVM cannot simplify and whose
lowering the LLVM code generator refused ("Binding of variable rmod ... conflicts")."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP, helper

from tests.harness import check_against_reference


def _heads_view_model():
    c = helper.make_tensor
    i64 = TP.INT64
    nodes = [
        helper.make_node("Concat", ["past", "new"], ["kv"], axis=2),
        helper.make_node("Shape", ["kv"], ["s"]),
        helper.make_node("Gather", ["s", "two"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        helper.make_node("Concat", ["minus_one", "n1", "d"], ["shape"], axis=0),
        helper.make_node("Reshape", ["kv", "shape"], ["y"]),
        helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["yt", "y"], ["out"]),
    ]
    inits = [c("two", i64, [], [2]), c("ax", i64, [1], [0]), c("minus_one", i64, [1], [-1]),
             c("d", i64, [1], [16])]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("past", TP.FLOAT, ["batch", 4, "past", 16]),
         helper.make_tensor_value_info("new", TP.FLOAT, ["batch", 4, "seq", 16])],
        [helper.make_tensor_value_info("out", TP.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_minus_one_is_the_leftover_factors():
    from tvmopt.frontend.importer import import_onnx

    ret = import_onnx(_heads_view_model()).mod["main"].ret_ty
    batch, rows, cols = ret.shape.values
    assert "//" not in str(batch) and "batch" in str(batch), ret
    assert (int(rows), int(cols)) == (16, 16)


def test_decoder_heads_view_compiles_and_matches():
    rng = np.random.default_rng(0)
    for batch, past, seq in [(2, 5, 3), (1, 0, 7)]:
        check_against_reference(_heads_view_model(), {
            "past": rng.standard_normal((batch, 4, past, 16)).astype(np.float32),
            "new": rng.standard_normal((batch, 4, seq, 16)).astype(np.float32)})
