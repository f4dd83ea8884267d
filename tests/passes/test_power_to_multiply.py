"""`x ** c` for small constant c compiles to multiplies (or sqrt, or a division), not one libm
`powf` per element: GPT-2's tanh GELU, exported from torch with symbolic batch/seq, has no pow
left in its generated code and matches onnxruntime at two shapes."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.harness import reference, run_onnxruntime


def _pow_model(exponent: float, shape=("n", 64)):
    nodes = [helper.make_node("Constant", [], ["e"], value=helper.make_tensor(
                 "e", TensorProto.FLOAT, [], [exponent])),
             helper.make_node("Pow", ["x", "e"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _powers_left(executable) -> list[str]:
    """Pow calls in the executable's LLVM IR (`llvm.pow.*`) and assembly (`powf`)."""
    import re

    found = []
    for lib in executable.mod.imports:
        found += re.findall(r"@(llvm\.pow[\w.]*)", lib.inspect_source("ll"))
        found += re.findall(r"\bpowf?\b", lib.inspect_source("asm"))
    return found


def _build(model):
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import build_in_memory

    return build_in_memory(import_onnx(model).mod)


def _run(executable, x):
    from tvmopt.runtime.in_memory import run_executable

    return run_executable(executable, [x])[0]


@pytest.mark.parametrize("exponent", [0.0, 1.0, 2.0, 3.0, 4.0, 0.5, -1.0])
def test_small_exponents_rewrite_exactly(exponent):
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.passes.power_to_multiply import PowerToMultiply

    model = _pow_model(exponent)
    rewritten = PowerToMultiply(import_onnx(model).mod)
    assert "R.power" not in rewritten.script()

    x = np.linspace(-30, 30, 3 * 64, dtype="float32").reshape(3, 64)
    if exponent in (0.5, -1.0):  # off the poles and the negative half of sqrt
        x = np.abs(x) + np.float32(0.25)
    got = _run(_build(model), x)
    want = reference(model, {"x": x})[0]
    # Two roundings at most for x**3 and x**4: within a couple of ulp of the true power.
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)


def test_other_exponents_keep_power():
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.passes.power_to_multiply import PowerToMultiply

    for exponent in (2.5, -2.0, 5.0):
        assert "R.power" in PowerToMultiply(import_onnx(_pow_model(exponent)).mod).script()


def test_gpt2_tanh_gelu_has_no_pow_and_matches_onnxruntime(tmp_path):
    torch = pytest.importorskip("torch")

    class NewGELU(torch.nn.Module):  # transformers' GPT-2 activation, as written there
        def forward(self, x):
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) *
                                               (x + 0.044715 * torch.pow(x, 3.0))))

    path = str(tmp_path / "gelu.onnx")
    torch.onnx.export(NewGELU().eval(), (torch.randn(2, 5, 32),), path, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch", 1: "seq"}},
                      opset_version=17, dynamo=False)
    model = onnx.load(path)
    assert "Pow" in [n.op_type for n in model.graph.node]

    ex = _build(model)
    assert _powers_left(ex) == []
    rng = np.random.default_rng(0)
    for batch, seq in ((2, 5), (3, 11)):
        x = (rng.standard_normal((batch, seq, 32)) * 4).astype("float32")
        np.testing.assert_allclose(_run(ex, x), run_onnxruntime(model, {"x": x})[0],
                                   rtol=1e-5, atol=1e-5)
