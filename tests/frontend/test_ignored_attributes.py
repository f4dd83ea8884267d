"""A node attribute or optional input its converter never reads is refused by name, not dropped."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvmopt.errors import ImportFailure, UnsupportedOpError
from tvmopt.frontend import onnx_ops
from tvmopt.frontend.importer import import_onnx


def _model(node, inputs, outputs, opset=17, inits=()):
    g = helper.make_graph([node], "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _vi(name, dims, t=TP.FLOAT):
    return helper.make_tensor_value_info(name, t, dims)


@pytest.fixture
def blind_leaky_relu(monkeypatch):
    """A LeakyRelu converter that never looks at alpha, and a Clip one that never reads max."""
    from tvm import relax

    def leaky(bb, inputs, attr, params, opset):
        return relax.op.nn.leakyrelu(inputs[0], 0.01)

    def clip(bb, inputs, attr, params, opset):
        return relax.op.maximum(inputs[0], inputs[1])

    monkeypatch.setitem(onnx_ops._REGISTRY, "LeakyRelu", onnx_ops._FunctionConverter(leaky))
    monkeypatch.setitem(onnx_ops._REGISTRY, "Clip", onnx_ops._FunctionConverter(clip))


def test_non_default_attribute_the_converter_ignores_is_refused(blind_leaky_relu):
    node = helper.make_node("LeakyRelu", ["x"], ["y"], name="act3", alpha=0.2)
    with pytest.raises(UnsupportedOpError,
                       match=r"node 'act3' \(LeakyRelu, opset 17\): .*attribute alpha=0\.2"):
        import_onnx(_model(node, [_vi("x", [2, 3])], [_vi("y", [2, 3])]))


def test_attribute_set_to_its_default_is_accepted(blind_leaky_relu):
    node = helper.make_node("LeakyRelu", ["x"], ["y"], name="act3", alpha=0.01)
    assert import_onnx(_model(node, [_vi("x", [2, 3])], [_vi("y", [2, 3])])).mod is not None


def test_optional_input_the_converter_ignores_is_refused(blind_leaky_relu):
    lo = numpy_helper.from_array(np.array(0, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(6, np.float32), "hi")
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip0")
    with pytest.raises(UnsupportedOpError, match=r"node 'clip0' \(Clip.*input 2 \('max' = hi\)"):
        import_onnx(_model(node, [_vi("x", [2, 3])], [_vi("y", [2, 3])], inits=[lo, hi]))


def test_real_converter_ignoring_range_stash_type_is_refused():
    # Range (opset 27) computes in stash_type; the converter computes in the input type.
    # (run-time operands: constant ones are folded by onnx's reference, the spec's semantics)
    node = helper.make_node("Range", ["s", "l", "d"], ["y"], name="r0", stash_type=TP.DOUBLE)
    model = _model(node, [_vi(n, []) for n in "sld"], [_vi("y", ["n"])], opset=27)
    with pytest.raises(UnsupportedOpError, match=r"node 'r0' \(Range, opset 27\).*stash_type=11"):
        import_onnx(model)


def test_real_converters_read_what_they_implement():
    # Split's num_outputs is checked against the node's outputs; QuantizeLinear's output_dtype
    # against the declared output type: both read, so both accepted when consistent.
    split = helper.make_node("Split", ["x"], ["a", "b"], name="sp", axis=0, num_outputs=2)
    assert import_onnx(_model(split, [_vi("x", [4])], [_vi("a", [2]), _vi("b", [2])],
                              opset=18)).mod is not None
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "sc")
    q = helper.make_node("QuantizeLinear", ["x", "sc"], ["y"], name="q0", output_dtype=TP.INT16)
    mod = import_onnx(_model(q, [_vi("x", [4])], [_vi("y", [4], TP.INT16)], opset=21,
                             inits=[scale])).mod
    assert "int16" in str(mod["main"].ret_ty)


def test_constant_gather_indices_outside_a_static_axis_are_refused():
    idx = numpy_helper.from_array(np.array([0, 3], np.int64), "idx")
    node = helper.make_node("Gather", ["x", "idx"], ["y"], name="g0", axis=1)
    with pytest.raises(ImportFailure, match=r"node 'g0' \(Gather, opset 17\): input 'indices' "
                                        r"\('idx'\): index 3 is outside \[-3, 2\]$"):
        import_onnx(_model(node, [_vi("x", [2, 3])], [_vi("y", [2, 2])], inits=[idx]))
    idx = numpy_helper.from_array(np.array([0, -3], np.int64), "idx")  # negative: from the end
    assert import_onnx(_model(node, [_vi("x", [2, 3])], [_vi("y", [2, 2])], inits=[idx])).mod


def test_narrow_output_type_the_graph_does_not_compute_is_refused():
    node = helper.make_node("Relu", ["x"], ["y"], name="r")
    with pytest.raises(ImportFailure, match=r"output 'y' is declared uint4, but the graph computes "
                                        r"float32 \(not the uint8 carrier of uint4\)"):
        import_onnx(_model(node, [_vi("x", [2, 3])], [_vi("y", [2, 3], TP.UINT4)]))


def test_empty_name_for_a_required_or_variadic_input_is_refused():
    node = helper.make_node("Concat", ["", "x"], ["y"], name="cat", axis=0)
    with pytest.raises(ImportFailure, match=r"node 'cat' \(Concat\): input 0 is empty, but "
                                            r"'inputs' is not optional"):
        import_onnx(_model(node, [_vi("x", [2, 3])], [_vi("y", [2, 3])]))


def _one_node(op, attrs, inputs=("x",), inits=()):
    node = helper.make_node(op, list(inputs), ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("op, attrs, inputs, inits, says", [
    ("ReduceMean", {"keepdims": 2}, ("x",), (), "keepdims=2 must be 0 or 1"),
    ("ArgMax", {"select_last_index": -1}, ("x",), (), "select_last_index=-1 must be 0 or 1"),
    ("LayerNormalization", {"epsilon": -1e3}, ("x", "s"),
     (numpy_helper.from_array(np.ones(8, "float32"), "s"),), "epsilon=-1000.0 must be >= 0"),
])
def test_attribute_values_the_op_cannot_mean_are_refused(op, attrs, inputs, inits, says):
    with pytest.raises(ImportFailure, match=says):
        import_onnx(_one_node(op, attrs, inputs, inits))


def test_valid_boolean_and_epsilon_values_import():
    import_onnx(_one_node("ReduceMean", {"keepdims": 0}))
    import_onnx(_one_node("LayerNormalization", {"epsilon": 0.0}, ("x", "s"),
                          (numpy_helper.from_array(np.ones(8, "float32"), "s"),)))
