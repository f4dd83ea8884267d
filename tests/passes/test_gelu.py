"""GELU spelled out by exporters (erf form, torch legacy export; tanh form, Hugging Face's
gelu_new) becomes one R.nn.gelu / R.nn.gelu_tanh whatever the order of its factors, the
result matches onnxruntime, and a dense layer followed by it is one oneDNN call with the GELU
as a post-op; look-alikes with other constants or another tensor are left alone."""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.onednn_required import require_onednn


def _c(name, v):
    return numpy_helper.from_array(np.array(v, np.float32), name)


def _model(nodes, inits, shape=("n", 32), extra_inputs=()):
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    ins += [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in extra_inputs]
    g = helper.make_graph(nodes, "g", ins,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def erf_torch():
    """torch's legacy export: x * (erf(x / sqrt2) + 1) * 0.5."""
    return _model([helper.make_node("Div", ["x", "r2"], ["d"]),
                   helper.make_node("Erf", ["d"], ["e"]),
                   helper.make_node("Add", ["e", "one"], ["a"]),
                   helper.make_node("Mul", ["x", "a"], ["m"]),
                   helper.make_node("Mul", ["m", "half"], ["y"])],
                  [_c("r2", math.sqrt(2)), _c("one", 1), _c("half", 0.5)])


def erf_half_first(x_name="x"):
    """0.5 * x first, erf of x * (1/sqrt2), the one added on the left."""
    return _model([helper.make_node("Mul", ["half", "x"], ["h"]),
                   helper.make_node("Mul", [x_name, "ir2"], ["d"]),
                   helper.make_node("Erf", ["d"], ["e"]),
                   helper.make_node("Add", ["one", "e"], ["a"]),
                   helper.make_node("Mul", ["h", "a"], ["y"])],
                  [_c("ir2", 1 / math.sqrt(2)), _c("one", 1), _c("half", 0.5)],
                  extra_inputs=("z",) if x_name != "x" else ())


def tanh_hf(cubic=0.044715):
    """HF gelu_new: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))."""
    return _model([helper.make_node("Pow", ["x", "three"], ["p"]),
                   helper.make_node("Mul", ["k", "p"], ["kp"]),
                   helper.make_node("Add", ["x", "kp"], ["s"]),
                   helper.make_node("Mul", ["c", "s"], ["cs"]),
                   helper.make_node("Tanh", ["cs"], ["t"]),
                   helper.make_node("Add", ["one", "t"], ["a"]),
                   helper.make_node("Mul", ["half", "x"], ["h"]),
                   helper.make_node("Mul", ["h", "a"], ["y"])],
                  [_c("three", 3), _c("k", cubic), _c("c", math.sqrt(2 / math.pi)),
                   _c("one", 1), _c("half", 0.5)])


def _simplified(model):
    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    return pipeline.optimize(import_onnx(model).mod, host_target().to_tvm(),
                             pipeline.PipelineConfig(dispatch="codegen"), until="simplify").mod


def _check_runs(model, feeds):
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    ex = pipeline.build(import_onnx(model).mod, host_target().to_tvm(),
                        pipeline.PipelineConfig(dispatch="codegen"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(v) for v in feeds.values()]).numpy()
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make,op", [(erf_torch, "R.nn.gelu("), (erf_half_first, "R.nn.gelu("),
                                     (tanh_hf, "R.nn.gelu_tanh(")])
def test_spelled_out_gelu_becomes_one_op_and_matches(make, op):
    model = make()
    text = _simplified(model)["main"].script(show_meta=False)
    assert text.count(op) == 1 and "R.erf(" not in text and "R.tanh(" not in text, text
    x = np.random.default_rng(0).standard_normal((37, 32)).astype(np.float32) * 3
    _check_runs(model, {"x": x})


@pytest.mark.parametrize("make", [lambda: tanh_hf(cubic=0.05),
                                  lambda: erf_half_first(x_name="z")])
def test_look_alikes_are_left_alone(make):
    model = make()
    text = _simplified(model)["main"].script(show_meta=False)
    assert "R.nn.gelu" not in text
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal((5, 32)).astype(np.float32)
             for i in model.graph.input}
    _check_runs(model, feeds)


def test_dense_layer_then_spelled_out_gelu_is_one_library_call():
    od = require_onednn()
    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    m = erf_torch()
    g = m.graph
    g.input[0].type.tensor_type.shape.dim[1].dim_value = 16
    g.initializer.extend([numpy_helper.from_array(
        np.random.default_rng(2).standard_normal((16, 32)).astype(np.float32), "W")])
    g.node.insert(0, helper.make_node("MatMul", ["x", "W"], ["xw"]))
    for n in g.node[1:]:
        n.input[:] = ["xw" if i == "x" else i for i in n.input]
    mod = pipeline.optimize(import_onnx(m).mod, host_target().to_tvm(),
                            pipeline.PipelineConfig(dispatch="library"), until="dispatch").mod
    text = mod["main"].script(show_meta=False)
    assert text.count(f'R.call_dps_packed("{od.MATMUL_FUNC}"') == 1
    assert "gelu" not in text.replace(od.MATMUL_FUNC, "")  # the GELU went into the call
