"""Kernels that take a run-time scalar (a KV cache's past length as a PrimValue) stay unfused:
FuseTIR would define that var twice in the fused kernel and TVM's RenewDefs stops."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from tests.harness import reference, run_tvmopt


def _positions_model():
    """Position ids of a decoder step: arange(new tokens) + past length, both read from shapes
    (as torch's dynamo exporter writes GPT-2 and LLaMA): the group of arange, the past length
    as a tensor and the add has no tensor input to take `seq` from."""
    i64 = TensorProto.INT64
    c = helper.make_tensor
    nodes = [
        helper.make_node("Shape", ["past"], ["past_1d"], start=1, end=2),
        helper.make_node("Squeeze", ["past_1d"], ["past_len"]),
        helper.make_node("Shape", ["x"], ["seq_1d"], start=1, end=2),
        helper.make_node("Squeeze", ["seq_1d"], ["seq"]),
        helper.make_node("Range", ["zero", "seq", "one"], ["ar"]),
        helper.make_node("Add", ["ar", "past_len"], ["pos"]),
    ]
    inits = [c("one", i64, [], [1]), c("zero", i64, [], [0])]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 4]),
         helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, "past", 4])],
        [helper.make_tensor_value_info("pos", i64, ["seq"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_position_ids_from_a_past_length_compile_and_run():
    model = _positions_model()
    rng = np.random.default_rng(0)
    for seq, past in [(1, 37), (5, 0), (3, 11)]:
        feeds = {"x": rng.standard_normal((1, seq, 4)).astype(np.float32),
                 "past": rng.standard_normal((1, past, 4)).astype(np.float32)}
        got = run_tvmopt(model, feeds)
        np.testing.assert_allclose(got[0], reference(model, feeds)[0], rtol=1e-6)


def test_only_kernels_called_with_a_scalar_argument_become_opaque():
    import tvm
    from tvm import relax, te, tirx

    from tvmopt.passes.scalar_params import OpaqueScalarKernels

    n, k = tirx.Var("n", "int64"), tirx.Var("k", "int64")
    a = te.placeholder((n,), "int64", "a")
    shifted = te.create_prim_func([a, te.compute((n,), lambda i: a[i] + k), k])
    doubled = te.create_prim_func([a, te.compute((n,), lambda i: a[i] * 2)])
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n,), "int64"))
    p = relax.Var("p", tvm.ir.PrimType("int64"))
    shift_gv = bb.add_func(shifted, "shifted")
    double_gv = bb.add_func(doubled, "doubled")
    with bb.function("main", [x, p]):
        with bb.dataflow():
            y = bb.emit(relax.call_tir(shift_gv, [x, p], relax.TensorType((n,), "int64")))
            z = bb.emit(relax.call_tir(double_gv, [y], relax.TensorType((n,), "int64")))
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    mod = OpaqueScalarKernels(relax.transform.AnnotateTIROpPattern()(bb.get()))
    patterns = {gv.name_hint: int(f.attrs["op_pattern"]) for gv, f in mod.functions.items()
                if isinstance(f, tirx.PrimFunc)}
    assert patterns["shifted"] == 8  # opaque
    assert patterns["doubled"] != 8
