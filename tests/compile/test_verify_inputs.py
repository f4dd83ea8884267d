"""`compile --verify` draws its inputs: where the drawn sizes are ones the model refuses
together, the error says so, names the sizes drawn and what to pass, and --dim fixes it."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from tvmopt.errors import VerificationError
from tvmopt.interface.compile import CompileOptions, compile_model


def _lookup(path):
    # ids index a table whose length is its own symbolic dim: drawn as 1, the ids (drawn in
    # 0..9) fall outside it
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "lookup",
        [helper.make_tensor_value_info("table", TensorProto.FLOAT, ["rows"]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def test_inputs_the_model_refuses_are_named_with_the_fix(tmp_path):
    model = _lookup(tmp_path / "lookup.onnx")
    with pytest.raises(VerificationError) as err:
        compile_model(CompileOptions(model=model, target="host", verify=True,
                                     output=str(tmp_path / "a.tvmopt"), dispatch="codegen"),
                      log=lambda s: None)
    line = str(err.value)
    assert "\n" not in line
    assert "the verification inputs (n=1, rows=1) are refused by the model" in line
    assert "out of range" in line and "pass --dim NAME=N" in line
    ok = compile_model(CompileOptions(model=model, target="host", verify=True,
                                      verify_dims={"rows": 10, "n": 4},
                                      output=str(tmp_path / "b.tvmopt"), dispatch="codegen"),
                       log=lambda s: None)
    assert ok.verification
