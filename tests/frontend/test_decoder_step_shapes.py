"""Shape arithmetic of a decoder's decode step (issue 47), each cause as a small graph compared
with onnxruntime at several sizes of its symbolic dims, 1 among them.

- The causal mask's query positions `Range(0, seq) + past`, then Unsqueezes: with seq fixed at
  1 the Range folds to the constant `[0]`, and TVM folded `[0] + past` to the scalar `past`, a
  rank too few ("Unsqueeze axis 3 is out of range for rank 3").
- A new key of batch 1 concatenated to a past of symbolic batch: the concat asserted `1` to be
  `batch`, TVM's CanonicalizeBindings dropped that match_cast, and the concat's shape went
  unknown ("emit_te now only supports Tensor that has ShapeExpr shape").
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP, helper

from tests.harness import run_onnxruntime


def _model(nodes, inputs, inits, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _run(model, feeds, shapes=None):
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import run_in_memory

    imported = import_onnx(model, shapes)
    return run_in_memory(imported.mod, [feeds[i.name] for i in imported.inputs])


def _check(model, feeds, shapes=None):
    got = _run(model, feeds, shapes)
    want = run_onnxruntime(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _query_positions_model(seq_dim):
    """`(Range(0, seq) + past)[None, None, :, None]` as float, seq read from the ids' shape."""
    c = helper.make_tensor
    i64 = TP.INT64
    nodes = [
        helper.make_node("Shape", ["ids"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["seq"], axis=0),
        helper.make_node("Shape", ["past_kv"], ["ps"]),
        helper.make_node("Gather", ["ps", "two"], ["past"], axis=0),
        helper.make_node("Range", ["zero", "seq", "one"], ["r"]),
        helper.make_node("Add", ["r", "past"], ["q"]),
        helper.make_node("Unsqueeze", ["q", "ax0"], ["q0"]),
        helper.make_node("Unsqueeze", ["q0", "ax1"], ["q1"]),
        helper.make_node("Unsqueeze", ["q1", "ax3"], ["q3"]),
        helper.make_node("Cast", ["q3"], ["y"], to=TP.FLOAT),
    ]
    inits = [c("zero", i64, [], [0]), c("one", i64, [], [1]), c("two", i64, [], [2]),
             c("ax0", i64, [1], [0]), c("ax1", i64, [1], [1]), c("ax3", i64, [1], [3])]
    return _model(nodes, [helper.make_tensor_value_info("ids", i64, ["batch", seq_dim]),
                          helper.make_tensor_value_info("past_kv", TP.FLOAT,
                                                        ["batch", 2, "past", 4])], inits)


@pytest.mark.parametrize("seq_dim", ["seq", 1])
def test_query_positions_keep_their_rank(seq_dim):
    model = _query_positions_model(seq_dim)
    for batch, seq, past in [(1, 1, 0), (1, 1, 1), (2, 1, 5), (1, 3, 2)]:
        if isinstance(seq_dim, int) and seq != seq_dim:
            continue
        _check(model, {"ids": np.zeros((batch, seq), np.int64),
                       "past_kv": np.zeros((batch, 2, past, 4), np.float32)})


def test_query_positions_with_seq_fixed_by_shape_override():
    model = _query_positions_model("seq")
    for past in (0, 1, 5):
        feeds = {"ids": np.zeros((1, 1), np.int64),
                 "past_kv": np.zeros((1, 2, past, 4), np.float32)}
        got = _run(model, feeds, {"ids": (1, 1)})[0]
        np.testing.assert_array_equal(got, run_onnxruntime(model, feeds)[0])


@pytest.mark.parametrize("op,const,dtype", [
    ("Add", [0], TP.INT64),             # 1-d, one element: stays a shape value
    ("Sub", [7, 1, 0], TP.INT64),       # several elements: TVM's fold failed in .item()
    ("Mul", [[2]], TP.INT64),           # 2-d, one element
    ("Div", [9], TP.INT32),             # int32 array, the dim cast to int32
])
def test_scalar_dim_beside_constant_array_keeps_the_arrays_shape(op, const, dtype):
    c = helper.make_tensor
    arr = np.array(const)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0)]
    n = "n"
    if dtype != TP.INT64:
        nodes.append(helper.make_node("Cast", ["n"], ["n32"], to=dtype))
        n = "n32"
    nodes += [helper.make_node(op, ["k", n] if op != "Div" else [n, "k"], ["r"]),
              helper.make_node("Cast", ["r"], ["y"], to=TP.FLOAT)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3])],
                   [c("zero", TP.INT64, [], [0]),
                    c("k", dtype, list(arr.shape), arr.flatten().tolist())])
    for n_value in (1, 4, 11):
        _check(model, {"x": np.zeros((n_value, 3), np.float32)})


def test_float_dim_beside_constant_array():
    c = helper.make_tensor
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Cast", ["n"], ["nf"], to=TP.FLOAT),
             helper.make_node("Mul", ["nf", "half"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3])],
                   [c("zero", TP.INT64, [], [0]), c("half", TP.FLOAT, [2], [0.5, 0.25])])
    for n_value in (1, 6):
        _check(model, {"x": np.zeros((n_value, 3), np.float32)})


def _kv_concat_model(new_shape=(1, 2, 1, 4)):
    """A new key computed from fixed-size inputs (batch 1) appended to a past of symbolic batch,
    then a rank-5 expand_dims (the grouped-query heads' repeat) and a reduction."""
    c = helper.make_tensor
    nodes = [
        helper.make_node("Add", ["new", "new"], ["k"]),
        helper.make_node("Concat", ["past", "k"], ["kv"], axis=-2),
        helper.make_node("Unsqueeze", ["kv", "ax2"], ["kv5"]),
        helper.make_node("Mul", ["kv5", "kv5"], ["sq"]),
        helper.make_node("ReduceSum", ["sq", "ax3"], ["y"], keepdims=1),
    ]
    return _model(nodes, [helper.make_tensor_value_info("past", TP.FLOAT, ["batch", 2, "past", 4]),
                          helper.make_tensor_value_info("new", TP.FLOAT, list(new_shape))],
                  [c("ax2", TP.INT64, [1], [2]), c("ax3", TP.INT64, [1], [3])])


def test_static_key_beside_symbolic_batch_past_keeps_its_shape():
    from tvm import relax

    from tvmopt.frontend.importer import import_onnx

    model = _kv_concat_model()
    ret = import_onnx(model).mod["main"].ret_ty
    assert isinstance(ret, relax.TensorType) and ret.shape is not None, ret
    rng = np.random.default_rng(0)
    for past in (0, 1, 5):
        feeds = {"past": rng.standard_normal((1, 2, past, 4)).astype(np.float32),
                 "new": rng.standard_normal((1, 2, 1, 4)).astype(np.float32)}
        got = _run(model, feeds)[0]
        np.testing.assert_allclose(got, run_onnxruntime(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_static_key_beside_symbolic_batch_refuses_another_batch_at_run_time():
    model = _kv_concat_model()
    feeds = {"past": np.zeros((2, 2, 3, 4), np.float32), "new": np.zeros((1, 2, 1, 4), np.float32)}
    with pytest.raises(Exception, match="match_cast|mismatch"):
        _run(model, feeds)


def test_override_fixes_a_named_dim_in_every_input():
    """`--shape new=1x2x1x4` over `[batch, 2, seq, 4]` fixes batch (and seq) to 1 in the past
    too; the model itself is left as declared."""
    from tvmopt.frontend.importer import import_onnx

    model = _kv_concat_model(("batch", 2, "seq", 4))
    before = model.SerializeToString()
    imported = import_onnx(model, {"new": (1, 2, 1, 4)})
    assert model.SerializeToString() == before
    shapes = {i.name: i.shape for i in imported.inputs}
    assert shapes == {"past": (1, 2, "past", 4), "new": (1, 2, 1, 4)}
    rng = np.random.default_rng(1)
    for past in (0, 1, 5):
        feeds = {"past": rng.standard_normal((1, 2, past, 4)).astype(np.float32),
                 "new": rng.standard_normal((1, 2, 1, 4)).astype(np.float32)}
        got = _run(model, feeds, {"new": (1, 2, 1, 4)})[0]
        np.testing.assert_allclose(got, run_onnxruntime(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_override_conflicting_on_a_name_leaves_it_symbolic_elsewhere():
    from tvmopt.frontend.onnx_model import fixed_named_dims
    from tvmopt.tensor_info import TensorInfo

    inputs = [TensorInfo("a", ("batch", "seq"), "int64"), TensorInfo("b", ("batch", "seq"), "int64"),
              TensorInfo("c", ("batch", 4), "float32")]
    assert fixed_named_dims(inputs, {"a": (1, 3), "b": (2, 3)}) == {"seq": 3}
