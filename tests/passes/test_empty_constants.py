"""Zero-element constants survive export: the artifact's library loads and runs."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tests.harness import compile_and_run, reference


def test_empty_initializer_in_a_concat_loads_from_the_artifact(tmp_path):
    # TVM 0.27 writes an empty constant into the library that its loader then refuses
    empty = numpy_helper.from_array(np.zeros((2, 0), np.float32), "empty")
    node = helper.make_node("Concat", ["empty", "x"], ["y"], axis=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [empty])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    got = compile_and_run(model, feeds, tmp_path)
    np.testing.assert_array_equal(got[0], reference(model, feeds)[0])


def test_pass_replaces_only_empty_constants():
    import tvm
    from tvm import relax

    from tvmopt.passes.empty_constants import EmptyConstantsToAllocs

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        empty = relax.const(np.zeros((2, 0), np.float32))
        full = relax.const(np.ones((2, 3), np.float32))
        y = bb.emit(relax.op.concat([empty, relax.op.add(x, full)], axis=1))
        bb.emit_func_output(y)
    mod = EmptyConstantsToAllocs(bb.get())
    text = mod.script(show_meta=False)
    assert "alloc_tensor(R.shape([2, 0])" in text
    assert text.count('metadata["ir.GenericConst"]') == 1  # the non-empty one is kept
    assert isinstance(mod, tvm.IRModule)
