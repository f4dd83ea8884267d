"""Models the importer would otherwise reinterpret silently are refused by name."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tvmopt.cli.main import main
from tvmopt.errors import UnsupportedOpError
from tvmopt.frontend.importer import import_onnx, newest_known_opset


def _matmul_model(domain="", opset=17, extra_opsets=()):
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm0", domain=domain)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])], [w])
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in extra_opsets]
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 10
    return m


def test_custom_domain_op_named_like_a_standard_op_is_refused():
    model = _matmul_model(domain="com.example.secret", extra_opsets=["com.example.secret"])
    with pytest.raises(UnsupportedOpError, match=r"com\.example\.secret::MatMul \(nodes: mm0\)"):
        import_onnx(model)


def test_contrib_op_only_under_its_own_domain():
    # FastGelu is implemented as com.microsoft defines it; in another domain it is unknown.
    def gelu_model(domain):
        node = helper.make_node("FastGelu", ["x"], ["y"], name="g0", domain=domain)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid(domain, 1)])
        m.ir_version = 10
        return m

    assert import_onnx(gelu_model("com.microsoft")).mod is not None
    with pytest.raises(UnsupportedOpError, match=r"com\.other::FastGelu"):
        import_onnx(gelu_model("com.other"))


def test_opset_newer_than_known_is_refused_unless_allowed():
    too_new = newest_known_opset() + 71
    model = _matmul_model(opset=too_new)
    with pytest.raises(UnsupportedOpError, match=rf"opset {too_new}, newer than .*--allow-newer-opset"):
        import_onnx(model)
    assert import_onnx(model, allow_newer_opset=True).opset == newest_known_opset()


def test_inspect_shows_the_same_verdicts(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_matmul_model(domain="com.example.secret", opset=newest_known_opset() + 1,
                            extra_opsets=["com.example.secret"]), str(path))
    res = CliRunner().invoke(main, ["inspect", str(path), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["unsupported"] == {"com.example.secret::MatMul": ["mm0"]}
    assert "--allow-newer-opset" in info["opset_refusal"]


def test_compile_of_custom_domain_model_is_one_line_and_exit_1(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_matmul_model(domain="com.example.secret", extra_opsets=["com.example.secret"]),
              str(path))
    res = CliRunner().invoke(main, ["compile", str(path), "-o", str(tmp_path / "a")])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "com.example.secret::MatMul" in lines[0] and "mm0" in lines[0]
    assert not (tmp_path / "a").exists()
