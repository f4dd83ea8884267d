"""Refusals read as what the user's model does, never as an internal TVM check or a Python
repr; and the constructs behind the earlier internal messages are supported where they can be.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.harness import check_single_output, reference, run_tvmopt
from tests.models import graph_model, single_output_model
from tvmopt.errors import ImportFailure, UnsupportedOpError
from tvmopt.frontend.importer import import_onnx


@pytest.mark.parametrize("size,align", [((2, 3, 5, 6), 0), ((2, 3, 5, 6), 1),
                                        ((2, 3, 4, 1, 3), 1), ((2, 3, 4, 5, 3), 0)])
def test_affine_grid_size_fed_at_run_time(size, align):
    rank = len(size) - 2
    theta = np.random.default_rng(7).standard_normal((2, rank, rank + 1)).astype("float32")
    node = helper.make_node("AffineGrid", ["theta", "size"], ["y"], align_corners=align)
    got = check_single_output(node, {"theta": theta, "size": np.array(size, "int64")}, opset=20)
    assert got.shape == (2, *size[2:], rank)


def test_affine_grid_run_time_size_follows_the_fed_size():
    theta = np.random.default_rng(8).standard_normal((1, 2, 3)).astype("float32")
    node = helper.make_node("AffineGrid", ["theta", "size"], ["y"])
    model = single_output_model(node, {"theta": theta, "size": np.array([1, 1, 2, 2], "int64")},
                                {}, opset=20)
    from tests.harness import load_tvmopt

    lm = load_tvmopt(model)
    for size in ([1, 1, 2, 2], [1, 3, 4, 7]):
        feeds = {"theta": theta, "size": np.array(size, "int64")}
        got = lm.run(feeds)["y"]
        np.testing.assert_allclose(got, reference(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["uint64", "uint32", "uint16", "int16"])
def test_top_k_of_types_the_sort_library_lacks(dtype):
    info = np.iinfo(dtype)
    x = np.array([[info.max, 0, info.max - 3, 7], [5, info.min, info.max // 2 + 1, 1]], dtype)
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"])
    model = graph_model(node, {"x": x}, ["values", "indices"],
                        consts={"k": np.array([3], "int64")}, opset=11)
    got = run_tvmopt(model, {"x": x})
    want = reference(model, {"x": x})
    assert got[0].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_optional_has_element_with_no_input_is_false():
    x = np.ones((2,), "float32")
    nodes = [helper.make_node("OptionalHasElement", [], ["has"]),
             helper.make_node("Identity", ["x"], ["y"])]
    model = graph_model(nodes, {"x": x}, ["has", "y"], opset=18)
    has, _ = run_tvmopt(model, {"x": x})
    assert has.dtype == np.bool_ and not has


def test_string_inputs_are_refused_by_name():
    node = helper.make_node("Equal", ["a", "b"], ["y"], name="eq0")
    strings = [helper.make_tensor_value_info(n, TensorProto.STRING, [3]) for n in "ab"]
    g = helper.make_graph([node], "g", strings,
                          [helper.make_tensor_value_info("y", TensorProto.BOOL, [3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    with pytest.raises(UnsupportedOpError, match=r"'a'.*'eq0' \(Equal\).*string tensors are not "
                                                 r"supported"):
        import_onnx(model)


def test_sequence_input_is_refused_as_what_it_is():
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2])
    node = helper.make_node("SequenceLength", ["s"], ["n"])
    g = helper.make_graph([node], "g", [seq], [helper.make_tensor_value_info("n", TensorProto.INT64,
                                                                              [])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOpError, match="input 's' is a sequence: only tensor inputs"):
        import_onnx(model)


def _branch(name, nodes, out):
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT,
                                                                             None)])


def test_if_on_a_constant_condition_imports_only_the_taken_branch():
    # The untaken branch cannot import at all (a reshape of 6 values to 4); with the condition
    # known, only the taken branch is imported, as onnxruntime runs it.
    x = np.arange(6, dtype="float32").reshape(2, 3)
    then = _branch("then", [helper.make_node("Neg", ["x"], ["t"])], "t")
    els = _branch("else", [helper.make_node("Reshape", ["x", "bad"], ["e"])], "e")
    nodes = [helper.make_node("Size", ["x"], ["n"]),
             helper.make_node("Equal", ["n", "six"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=els)]
    model = graph_model(nodes, {"x": x}, ["y"], consts={"six": np.array(6, "int64"),
                                                         "bad": np.array([2, 2], "int64")})
    np.testing.assert_array_equal(run_tvmopt(model, {"x": x})[0], -x)


def test_a_tvm_check_escaping_a_converter_names_the_node_and_the_cause():
    # Squeeze without axes of a tensor whose dims are fed at run time: the rank is unknown until
    # the model runs, and Transpose needs it. TVM's own text is an internal check.
    x = np.ones((1, 3), "float32")
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"]),
             helper.make_node("Squeeze", ["e"], ["s"]),
             helper.make_node("Transpose", ["s"], ["y"], name="tr0", perm=[1, 0])]
    model = graph_model(nodes, {"x": x, "shape": np.array([2, 3], "int64")}, ["y"])
    with pytest.raises(ImportFailure) as err:
        import_onnx(model)
    text = str(err.value)
    assert text.startswith("node 'tr0' (Transpose, opset 19): input 0 's' has a rank unknown "
                           "at compile time"), text
    assert "\n" not in text
