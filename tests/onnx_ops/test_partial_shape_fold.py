"""Static dims read out of a shape whose other dims are symbolic (`Shape(x)[2]` of a (batch,
C, 8, 8) map) fold before import, so arithmetic on them (MobileViT's `ceil(h / p) * p`, as
the TorchScript exporter writes it) gives a reshape constant dims, and the LayerNorm and
MatMul over the static width that follow keep their shapes."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as TP, helper, numpy_helper

from tests.harness import check_against_reference


def _unfold_model():
    c = helper.make_tensor
    rng = np.random.default_rng(1)
    f32 = lambda a, n: numpy_helper.from_array(a.astype(np.float32), n)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "two"], ["h"], axis=0),
        helper.make_node("Cast", ["h"], ["hf"], to=TP.FLOAT),
        helper.make_node("Div", ["hf", "patch"], ["q"]),
        helper.make_node("Ceil", ["q"], ["qc"]),
        helper.make_node("Mul", ["qc", "patch"], ["w"]),
        helper.make_node("Cast", ["w"], ["wi"], to=TP.INT64),
        helper.make_node("Unsqueeze", ["wi", "ax"], ["w1"]),
        helper.make_node("Concat", ["minus_one", "w1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["rows"]),
        helper.make_node("LayerNormalization", ["rows", "gamma", "beta"], ["n"], axis=-1),
        helper.make_node("MatMul", ["n", "wm"], ["y"]),
    ]
    inits = [c("two", TP.INT64, [], [2]), c("patch", TP.FLOAT, [], [2.0]),
             c("ax", TP.INT64, [1], [0]), c("minus_one", TP.INT64, [1], [-1]),
             f32(rng.standard_normal(8), "gamma"), f32(rng.standard_normal(8), "beta"),
             f32(rng.standard_normal((8, 3)), "wm")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 4, 8, 8])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["rows", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_static_dim_of_a_symbolic_shape_folds():
    from tvmopt.frontend.onnx_ops.preprocess import fold_constants

    ops = [n.op_type for n in fold_constants(_unfold_model()).graph.node]
    assert "Ceil" not in ops and "Gather" not in ops, ops
    assert "Shape" not in ops  # nothing reads the symbolic shape any more


def test_unfold_reshape_then_layer_norm_runs():
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        check_against_reference(_unfold_model(), {
            "x": rng.standard_normal((batch, 4, 8, 8)).astype(np.float32)}, rtol=1e-4,
            atol=1e-5)


def test_slice_of_static_dims_folds_and_of_a_symbolic_dim_does_not():
    from onnx import numpy_helper as nh

    from tvmopt.frontend.onnx_ops.preprocess import fold_constants

    c = helper.make_tensor
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "two", "four"], ["hw"]),
             helper.make_node("Slice", ["s", "zero", "two"], ["bc"])]
    inits = [c("two", TP.INT64, [1], [2]), c("four", TP.INT64, [1], [4]),
             c("zero", TP.INT64, [1], [0])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 4, 8, 6])],
        [helper.make_tensor_value_info("hw", TP.INT64, [2]),
         helper.make_tensor_value_info("bc", TP.INT64, [2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folded = {n.output[0]: n for n in fold_constants(model).graph.node}
    assert folded["hw"].op_type == "Constant"
    assert nh.to_array(folded["hw"].attribute[0].t).tolist() == [8, 6]
    assert folded["bc"].op_type == "Slice"  # batch is symbolic


def _anchor_model():
    """A detector head's anchor grid: Range over a feature map's height, read through Shape,
    Gather and Cast, after a `torch.chunk` (a Slice whose end is half the channels, from Shape
    arithmetic). ONNX's shape inference runs before that end folds, so it knows nothing of the
    chunk's shape and the folding before import leaves the Range; the import knows the height."""
    c = helper.make_tensor
    nodes = [
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Gather", ["xs", "one_i"], ["ch"], axis=0),
        helper.make_node("Div", ["ch", "two_i"], ["half_ch"]),
        helper.make_node("Unsqueeze", ["half_ch", "ax0"], ["end"]),
        helper.make_node("Slice", ["x", "zero_1", "end", "one_1"], ["f"]),
        helper.make_node("Shape", ["f"], ["s"]),
        helper.make_node("Gather", ["s", "two_i"], ["h"], axis=0),
        helper.make_node("Cast", ["h"], ["hf"], to=TP.FLOAT),
        helper.make_node("Range", ["zero", "hf", "one"], ["r"]),
        helper.make_node("Add", ["r", "half"], ["centres"]),
        helper.make_node("Unsqueeze", ["centres", "one_1"], ["col"]),
        helper.make_node("Mul", ["f", "col"], ["y"]),
    ]
    inits = [c("one_i", TP.INT64, [], [1]), c("two_i", TP.INT64, [], [2]),
             c("ax0", TP.INT64, [1], [0]), c("zero_1", TP.INT64, [1], [0]),
             c("one_1", TP.INT64, [1], [1]), c("zero", TP.FLOAT, [], [0.0]),
             c("one", TP.FLOAT, [], [1.0]), c("half", TP.FLOAT, [], [0.5])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 4, 6, 6])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["batch", 2, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_range_over_a_static_dim_the_folding_missed_is_a_constant():
    """Its size stays static (no kernel sized at run time: tune can time it, the build has no
    run-time shape), and it computes ONNX's values."""
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.frontend.onnx_ops.preprocess import fold_constants

    model = _anchor_model()
    assert "Range" in [n.op_type for n in fold_constants(model).graph.node]  # missed there
    text = import_onnx(model, {"x": (2, 4, 6, 6)}).mod["main"].script()
    assert "arange" not in text and "tensor_to_shape" not in text, text
    rng = np.random.default_rng(0)
    for batch in (1, 2):
        check_against_reference(model, {
            "x": rng.standard_normal((batch, 4, 6, 6)).astype(np.float32)})


def test_a_range_of_known_but_infinite_operands_is_left_to_the_converter():
    """Known operands, but no length: the fold steps aside rather than raise."""
    from tvm import relax

    from tvmopt.frontend.onnx_ops.shape_values import _known_range

    c = lambda v: relax.const(np.array(v, np.float32))  # noqa: E731
    assert _known_range([c(0.0), c(np.inf), c(1.0)]) is None
    assert _known_range([c(0.0), c(np.nan), c(1.0)]) is None
    assert _known_range([c(0.0), c(3.0), c(1.0)]).value.numpy().tolist() == [0.0, 1.0, 2.0]
