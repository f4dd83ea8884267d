"""Zero pads fold into the convolution that reads them; other pads stay, and the model's
answers do not change."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.harness import compile_and_run, reference


def _pad_conv(pads, mode="constant", value=None, opset=17, group=1, stride=2):
    """x -> Pad(pads) -> Conv(3x3, no padding): TensorFlow's "same" padding as exporters
    write it (EfficientNet's depthwise convolutions)."""
    rng = np.random.default_rng(0)
    c = 8
    w = numpy_helper.from_array(rng.standard_normal((c, c // group, 3, 3)).astype("float32"), "w")
    p = numpy_helper.from_array(np.array(pads, np.int64), "pads")
    inits, pad_in = [w, p], ["x", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "v"))
        pad_in.append("v")
    nodes = [helper.make_node("Pad", pad_in, ["p"], mode=mode),
             helper.make_node("Conv", ["p", "w"], ["y"], strides=[stride, stride], group=group)]
    hw = (15 + pads[2] + pads[6] - 3) // stride + 1
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, c, 15, 15])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, hw, hw])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _simplified(model):
    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    mod = import_onnx(model).mod
    return pipeline.optimize(mod, host_target().to_tvm(), pipeline.PipelineConfig(),
                             until="simplify").mod.script(show_meta=False)


@pytest.mark.parametrize("group", [1, 8])
def test_an_asymmetric_zero_pad_becomes_the_convolutions_padding(tmp_path, group):
    model = _pad_conv([0, 0, 0, 0, 0, 0, 1, 1], group=group)  # bottom/right only, as TF pads
    text = _simplified(model)
    assert "R.nn.pad" not in text and "call_tir" not in text
    assert "padding=[0, 0, 1, 1]" in text
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 15, 15)).astype("float32")}
    np.testing.assert_allclose(compile_and_run(model, x, tmp_path)[0], reference(model, x)[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", [
    dict(pads=[0, 0, 1, 1, 0, 0, 1, 1], value=2.5),       # pads with a non-zero value
    dict(pads=[0, 1, 1, 1, 0, 1, 1, 1]),                  # pads channels too
    dict(pads=[0, 0, 1, 1, 0, 0, 1, 1], mode="reflect"),  # not a constant pad
])
def test_other_pads_are_kept_and_stay_exact(tmp_path, case):
    model = _pad_conv(case["pads"], case.get("mode", "constant"), case.get("value"))
    if case["pads"][1] or case["pads"][5]:  # the conv's weights must match the padded channels
        model.graph.initializer[0].CopyFrom(numpy_helper.from_array(
            np.random.default_rng(0).standard_normal((8, 10, 3, 3)).astype("float32"), "w"))
    text = _simplified(model)
    assert "R.nn.pad" in text or "call_tir" in text
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 15, 15)).astype("float32")}
    np.testing.assert_allclose(compile_and_run(model, x, tmp_path)[0], reference(model, x)[0],
                               rtol=1e-4, atol=1e-4)


def test_a_pad_of_zero_widths_is_dropped():
    from tvm import relax

    from tvmopt.passes.fold_pad import FoldPadIntoConv

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.pad(x, [0, 0, 0, 0], "constant", 0.0))
            out = bb.emit_output(relax.op.add(y, y))
        bb.emit_func_output(out)
    mod = relax.transform.CanonicalizeBindings()(FoldPadIntoConv(bb.get()))
    text = mod.script(show_meta=False)
    assert "R.nn.pad" not in text and "R.add(x, x)" in text
