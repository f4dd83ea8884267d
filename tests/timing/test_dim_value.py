"""Shape expressions evaluated at sample sizes for planning: a size at which the expression
divides by zero (a length computed twice, once with ONNX's truncating Div, that is 0 for so
short an input) counts as unknown instead of failing the compile ("Divide by zero")."""

from __future__ import annotations

import pytest
from onnx import TensorProto as TP, helper

from tests.models import conv_length_nodes


def test_division_by_zero_at_the_sample_size_is_unknown():
    from tvm import tirx

    from tvmopt.timing import dim_value

    n = tirx.Var("samples", "int64")
    expr = tirx.floordiv(n * 4, tirx.Div(n, tirx.IntImm("int64", 5)))  # (4n) // trunc(n / 5)
    unknown: set[str] = set()
    assert dim_value(expr, {"samples": 1}, unknown) == 1
    assert str(expr) in unknown
    assert dim_value(expr, {"samples": 10}) == 20
    with pytest.raises(ValueError, match="does not reduce to a number"):
        dim_value(expr, {"samples": 1})


def test_plan_of_a_reshape_by_a_length_that_is_zero_at_size_one(tmp_path):
    """The precision plan sizes buffers at the default dims (1): there the truncated length of
    this reshape's divisor is 0. (The reshape itself is wav2vec2's, by the dynamo exporter.)"""
    from tvmopt import pipeline
    from tvmopt.front import fuse_and_plan
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.targets.registry import get_target

    c = helper.make_tensor
    i64 = TP.INT64
    nodes, inits = conv_length_nodes()
    nodes += [
        helper.make_node("Unsqueeze", ["len", "ax"], ["len1"]),
        helper.make_node("Concat", ["zero", "len1", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["y", "shape"], ["out"]),
    ]
    inits += [c("ax", i64, [1], [0]), c("zero", i64, [1], [0]), c("minus_one", i64, [1], [-1])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 1, "samples"])],
        [helper.make_tensor_value_info("out", TP.FLOAT, ["batch", "frames", "groups"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    hw = get_target("x86")
    cfg = pipeline.PipelineConfig(dispatch="codegen", hw=hw)
    plan = fuse_and_plan(import_onnx(model).mod, hw.to_tvm(), hw, cfg, "fp32").plan
    assert plan.precision == "fp32" and plan.kernels
