"""DropNonNegativeMin / ZeroPointZero: a dynamic quantization of an input that cannot be
negative loses its min reduction and its run-time zero point, and computes exactly what the
graph as imported computes; inputs that may be negative keep both."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax

from tvmopt.passes.dynamic_quant import DropNonNegativeMin, ZeroPointZero

_X = relax.TensorType((2, 8), "float32")


def _scalar(v):
    return relax.const(np.array(v, dtype="float32"), "float32")


def _range_module(producer, bound: float = 0.0):
    """main(x) = minimum(bound, min(producer(x))), as DynamicQuantizeLinear's rmin reads."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", _X)
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(producer(x))
            m = bb.emit(relax.op.min(a))
            out = bb.emit_output(relax.op.minimum(_scalar(bound), m))
        bb.emit_func_output(out)
    return bb.get()


_PRODUCERS = {
    "relu": (lambda x: relax.op.nn.relu(x), True),
    "clip 0..6": (lambda x: relax.op.clip(x, 0, 6), True),
    "maximum with 0.5": (lambda x: relax.op.maximum(x, _scalar(0.5)), True),
    "sigmoid": (lambda x: relax.op.sigmoid(x), True),
    "transpose of a relu": (lambda x: relax.op.permute_dims(relax.op.nn.relu(x)), True),
    "mean of a relu": (lambda x: relax.op.mean(relax.op.nn.relu(x), axis=[1],
                                               keepdims=True), True),
    "clip -1..6": (lambda x: relax.op.clip(x, -1, 6), False),
    "the input": (lambda x: relax.op.permute_dims(x), False),
    "minimum of a relu and the input": (lambda x: relax.op.minimum(relax.op.nn.relu(x), x),
                                        False),
    "relu minus 1": (lambda x: relax.op.subtract(relax.op.nn.relu(x), _scalar(1.0)), False),
}


@pytest.mark.parametrize("name", list(_PRODUCERS))
def test_the_min_goes_only_where_the_producer_proves_the_input_non_negative(name):
    producer, dropped = _PRODUCERS[name]
    mod = DropNonNegativeMin(_range_module(producer))
    text = mod.script(show_meta=False)
    assert ("R.min(" not in text) == dropped, text
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    ex = tvm.compile(mod, "llvm")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    want = relax.VirtualMachine(tvm.compile(_range_module(producer), "llvm"),
                                tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert got == want


def test_a_bound_below_the_inputs_lower_bound_is_the_result_itself():
    # min(-1, min(relu(x))) is -1, not 0
    mod = DropNonNegativeMin(_range_module(lambda x: relax.op.nn.relu(x), bound=-1.0))
    text = mod["main"].script(show_meta=False)
    assert "R.min(" not in text and "-1.0" in text


def _compile(path, passes_on: bool, monkeypatch):
    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.passes import dynamic_quant
    from tvmopt.runtime.in_memory import host_target

    if not passes_on:
        keep = tvm.transform.module_pass(lambda mod, _ctx: mod, opt_level=0, name="keep")
        monkeypatch.setattr(dynamic_quant, "DropNonNegativeMin", keep)
        monkeypatch.setattr(dynamic_quant, "ZeroPointZero", keep)
    target = host_target().to_tvm()
    cfg = pipeline.PipelineConfig(dispatch="codegen")
    mod = pipeline.optimize(import_onnx(onnx.load(path)).mod, target, cfg, until="fastmath").mod
    ex = pipeline.build(mod, target, cfg=cfg, start_after="fastmath")
    monkeypatch.undo()
    return mod, ex


def test_a_quantized_cnn_on_the_default_schedules_computes_the_same_numbers(tmp_path,
                                                                          monkeypatch):
    """quantize_dynamic's DepthwiseCNN: four of its five dynamic quantizations read a ReLU6 or
    the mean of a ReLU; only the graph input keeps its min and zero point. The outputs are the
    imported graph's bit for bit, on an input of either sign and on a non-negative one."""
    import onnxruntime as ort

    from tests.models import quantized_depthwise_cnn

    path = quantized_depthwise_cnn(tmp_path)
    g = onnx.load(path).graph
    assert [n.op_type for n in g.node].count("DynamicQuantizeLinear") == 5
    mod, ex = _compile(path, True, monkeypatch)
    mod_off, ex_off = _compile(path, False, monkeypatch)

    def calls(m, kernel):
        return len(re.findall(rf"R\.call_tir\((?:cls\.)?{kernel}\d*,", m["main"].script()))

    # Legalized by then: the input's min reduction is left, and its zero point's subtraction.
    assert calls(mod, "min") == 1 and calls(mod_off, "min") == 5
    assert calls(mod, "subtract") < calls(mod_off, "subtract")
    rng = np.random.default_rng(1)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for x in (rng.standard_normal((1, 3, 16, 16)).astype(np.float32),
              np.abs(rng.standard_normal((1, 3, 16, 16))).astype(np.float32) * 4):
        got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
        off = relax.VirtualMachine(ex_off, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_array_equal(got, off)
        want = ref.run(None, {ref.get_inputs()[0].name: x})[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * np.abs(want).max())
