"""`tvmopt compile` + `tvmopt run` on models whose shapes depend on run-time values.

Each model takes its operand (sizes, axes, starts, k, pads, depth, window size) as a graph input,
or has an output whose size depends on the data (NonZero, Unique), so nothing about the output
shape is known when compiling: the planner, the manifest and the runtime must all cope. Results
are checked against onnx.reference.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(0)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _i64(*values):
    return np.array(values, dtype=np.int64)


# name: (node, {input: (onnx type, array)}, output names, opset)
CASES = {
    "resize_sizes": (
        helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest"),
        {"x": (F, _x(1, 1, 2, 3)), "sizes": (I64, _i64(1, 1, 4, 5))}, ["y"], 19),
    "reduce_sum_axes": (
        helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0),
        {"x": (F, _x(2, 3, 4)), "axes": (I64, _i64(0, 2))}, ["y"], 18),
    "slice_starts": (
        helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"]),
        {"x": (F, _x(5, 6)), "starts": (I64, _i64(1, -5)), "ends": (I64, _i64(4, 100)),
         "axes": (I64, _i64(0, 1)), "steps": (I64, _i64(1, 2))}, ["y"], 13),
    "topk_k": (
        helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1),
        {"x": (F, _x(3, 7)), "k": (I64, _i64(3))}, ["values", "indices"], 11),
    "pad_pads": (
        helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant"),
        {"x": (F, _x(2, 3)), "pads": (I64, _i64(0, 2, 1, 1))}, ["y"], 18),
    "onehot_depth": (
        helper.make_node("OneHot", ["indices", "depth", "values"], ["y"], axis=-1),
        {"indices": (I64, _i64(0, 3, 1)), "depth": (I64, np.array(5, np.int64)),
         "values": (F, np.array([0.0, 1.0], np.float32))}, ["y"], 11),
    "hann_window_size": (
        helper.make_node("HannWindow", ["size"], ["y"]),
        {"size": (I64, np.array(10, np.int64))}, ["y"], 17),
    "nonzero": (
        helper.make_node("NonZero", ["x"], ["y"]),
        {"x": (F, np.array([[1, 0, 2], [0, 0, 3]], np.float32))}, ["y"], 13),
    "unique": (
        helper.make_node("Unique", ["x"], ["y", "indices", "inverse", "counts"], sorted=1),
        {"x": (F, np.array([2, 1, 1, 3, 4, 3], np.float32))},
        ["y", "indices", "inverse", "counts"], 11),
}


def _model(node, inputs, outputs, opset):
    """The one-node model; outputs declare their type and rank only (sizes unknown)."""
    vis = [helper.make_tensor_value_info(n, t, a.shape) for n, (t, a) in inputs.items()]

    def build(outs):
        model = helper.make_model(helper.make_graph([node], "g", vis, outs),
                                  opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 10
        return model

    untyped = build([helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
                     for o in outputs])
    ref = ReferenceEvaluator(untyped).run(None, {n: a for n, (_, a) in inputs.items()})
    return build([helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(r.dtype),
                                                [None] * r.ndim) for o, r in zip(outputs, ref)])


@pytest.mark.parametrize("name", sorted(CASES))
def test_compile_and_run_with_run_time_operands(name, cli, save, tmp_path):
    node, inputs, outputs, opset = CASES[name]
    model = _model(node, inputs, outputs, opset)
    feeds = {n: a for n, (_, a) in inputs.items()}
    art = tmp_path / f"{name}.tvmopt"
    res = cli("compile", save(model, name), "-o", art)
    assert res.exit_code == 0, res.output

    # the manifest says which output sizes are known only at run time
    manifest = json.loads((art / "manifest.json").read_text())
    assert [o["name"] for o in manifest["outputs"]] == outputs
    assert all(o["shape"] is None or None in o["shape"] for o in manifest["outputs"]), \
        manifest["outputs"]

    np.savez(tmp_path / "in.npz", **feeds)
    res = cli("run", art, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz")
    assert res.exit_code == 0, res.output
    with np.load(tmp_path / "out.npz") as got:
        ref = ReferenceEvaluator(model).run(None, feeds)
        for out, want in zip(outputs, ref):
            g = got[out]
            assert g.shape == want.shape and g.dtype == want.dtype, (out, g.shape, want.shape)
            np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


def test_plan_says_which_kernels_have_run_time_sizes(cli, save):
    node, inputs, outputs, opset = CASES["topk_k"]
    path = save(_model(node, inputs, outputs, opset), "topk")
    res = cli("plan", path, "--json")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    assert plan["unestimated_kernels"], plan["kernels"]
    res = cli("plan", path)
    assert res.exit_code == 0, res.output
    assert "known only at run time" in res.output
