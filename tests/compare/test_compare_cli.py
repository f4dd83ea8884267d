"""`tvmopt compare` end to end on tiny pairs: JSON schema, attribution sums, one-line errors."""

import json
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.models import cnn, depthwise_cnn, make_model, rand, vi, const


def _one_line_error(res, *needles):
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("tvmopt: error: ") and "Traceback" not in res.output
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture
def pair(save, tmp_path):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    a = save(cnn(), "std")
    b = tmp_path / "std_int8.onnx"
    logging.getLogger().setLevel(logging.ERROR)
    quantize_dynamic(str(a), str(b), weight_type=QuantType.QInt8)
    return a, b


def _check_section(d):
    for key in ("a_ms", "b_ms", "ratio", "attribution", "unexplained_ms", "recommendations",
                "verdict", "explained_share", "explained_ok", "unexplained_kernels"):
        assert key in d, key
    assert d["ratio"] == pytest.approx(d["b_ms"] / d["a_ms"])
    total = sum(r["delta_ms"] for r in d["attribution"]) + d["unexplained_ms"]
    assert total == pytest.approx(d["b_ms"] - d["a_ms"], rel=1e-6, abs=1e-9)
    for r in d["attribution"]:
        assert set(r) >= {"cause", "delta_ms", "share", "kernels"}
    assert d["recommendations"]
    for r in d["recommendations"]:
        assert "predicted_ms" in r and "measured_ms" in r
    assert d["verdict"] and "\n" not in d["verdict"]


def test_onnxruntime_compare_of_a_quantized_pair(cli, pair, tmp_path):
    a, b = pair
    out = tmp_path / "c.json"
    res = cli("compare", a, b, "--runtime", "onnxruntime", "--runs", "6", "--profile-runs", "3",
              "-o", tmp_path / "o", "--json", out, "--report", tmp_path / "c.md", "--plot",
              tmp_path / "c.png", "-q")
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    _check_section(doc)
    assert doc["b"]["precision"] == "int8 (dynamic)" and doc["a"]["precision"] == "fp32"
    rows = {r["cause"]: r for r in doc["attribution"]}
    assert rows["int8_compute"]["b_ms"] > 0 and rows["quantize"]["b_ms"] > 0
    fold = next(r for r in doc["recommendations"] if r["id"] == "fold_quantization")
    assert fold["measured_ms"] is not None and fold["model"].endswith(".fp32w.onnx")
    assert "verdict" in res.output
    assert (tmp_path / "c.png").stat().st_size > 0
    assert "| cause |" in (tmp_path / "c.md").read_text()


@pytest.mark.slow  # compiles two models with tvmopt
def test_tvmopt_and_onnxruntime_sections_under_runtimes(cli, save, tmp_path):
    a = save(cnn(size=16), "std")
    b = save(depthwise_cnn(batch=1, size=16), "dw")
    out = tmp_path / "c.json"
    res = cli("compare", a, b, "--runtime", "both", "--runs", "6", "--profile-runs", "3",
              "-o", tmp_path / "o", "--json", out, "-q")
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert set(doc["runtimes"]) == {"tvmopt", "onnxruntime"}
    for d in doc["runtimes"].values():
        _check_section(d)
    # every callee of both builds (TIR kernels, library calls, VM builtins) has a named cause
    tvm_kernels = [k for side in doc["runtimes"]["tvmopt"]["profiles"].values() for k in side]
    assert tvm_kernels and all(k["cause"] != "other" for k in tvm_kernels), tvm_kernels
    assert doc["runtimes"]["tvmopt"]["unexplained_ms"] == 0.0
    assert doc["verdict"]


def test_unequal_inputs_are_one_line(cli, save, tmp_path):
    a = save(cnn(size=32), "a")
    b = save(cnn(size=16), "b")
    _one_line_error(cli("compare", a, b, "-o", tmp_path / "o"), "input 'x'", "1x3x32x32",
                    "1x3x16x16")


def test_unequal_outputs_are_one_line(cli, save, tmp_path):
    a = save(cnn(size=16), "a")
    m = make_model([helper.make_node("Flatten", ["x"], ["y"])], [vi("x", [1, 3, 16, 16])],
                   [vi("y", [1, 768])])
    b = save(m, "b")
    _one_line_error(cli("compare", a, b, "-o", tmp_path / "o"), "output", "1x768")


def _relu_and_unknown_op(save, tmp_path):
    """A loadable model and one whose only node is from a domain no runtime knows."""
    a = save(make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [1, 8])],
                        [vi("y", [1, 8])]), "a")
    g = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")],
                          "g", [vi("x", [1, 8])], [vi("y", [1, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.example", 1)])
    m.ir_version = 8
    b = tmp_path / "b.onnx"
    onnx.save(m, str(b))
    return a, b


def test_a_model_onnxruntime_cannot_load_is_one_line(cli, save, tmp_path):
    a, b = _relu_and_unknown_op(save, tmp_path)
    _one_line_error(cli("compare", a, b, "--runtime", "onnxruntime", "-o", tmp_path / "o"),
                    "onnxruntime cannot load", "b.onnx")


def test_missing_model_and_bad_usage_are_one_line(cli, save, tmp_path):
    a = save(cnn(size=16), "a")
    _one_line_error(cli("compare", a, tmp_path / "nope.onnx"), "no such file")
    _one_line_error(cli("compare", a), "two models")
    _one_line_error(cli("compare", a, a, "--precisions", "fp32,int8"), "one MODEL")
    _one_line_error(cli("compare", a, "--precisions", "fp32,fp8"), "unknown fp8")


def test_fp16_is_refused_on_a_target_without_it(cli, save, tmp_path):
    a = save(cnn(size=16), "a")
    _one_line_error(cli("compare", a, "--precisions", "fp32,fp16", "-o", tmp_path / "o"),
                    "fp16 on x86-avx2", "no fp16 arithmetic")


def test_precision_variants_of_one_model(cli, save, tmp_path):
    a = save(cnn(size=16), "a")
    out = tmp_path / "p.json"
    res = cli("compare", a, "--precisions", "fp32,fp16,int8", "--runtime", "onnxruntime",
              "--runs", "6", "--profile-runs", "3", "-o", tmp_path / "o", "--json", out, "-q")
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["precisions"] == {"a": "fp32", "b": "int8"}
    assert any("fp16 on x86-avx2" in r for r in doc["refused"])
    assert "refused: fp16 on x86-avx2" in res.output
    _check_section(doc)


def test_a_model_tvmopt_cannot_build_is_one_line(cli, save, tmp_path):
    a, b = _relu_and_unknown_op(save, tmp_path)
    _one_line_error(cli("compare", a, b, "--runtime", "tvmopt", "-o", tmp_path / "o", "-q"),
                    "tvmopt cannot build", "b.onnx", "Frobnicate")
