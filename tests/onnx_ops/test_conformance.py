"""ONNX coverage: a fixed sample of the ONNX node conformance cases, plus targeted cases.

Every case goes through the path a user takes (`compile_model` -> artifact folder ->
`runtime.load` -> `run`, as tools/onnx_conformance.py does), so the figure describes what
`tvmopt compile` delivers. The sample's pass count is recorded in
tests/data/onnx_conformance_sample.json; the test fails if it drops below it, or if any case
escapes with an internal error (raise the record when coverage improves).
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest

from tests.harness import compile_and_run

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "tests" / "data" / "onnx_conformance_sample.json"


def _tool():
    # Imported by its package name so that spawned workers can unpickle its cases.
    return importlib.import_module("tools.onnx_conformance")


@pytest.mark.slow
def test_conformance_sample_does_not_regress():
    record = json.loads(RECORD.read_text())
    tool = _tool()
    cases = tool.collect()
    assert len(cases) == record["total_cases"], "onnx's case set changed: re-record the sample"
    sample = sorted(random.Random(record["seed"]).sample(cases, record["sample"]),
                    key=lambda c: c.name)
    results = tool.run_cases(sample, jobs=2, timeout=120)
    internal = {r.name: r.reason for r in results if r.stage in ("internal", "crash")}
    assert not internal, f"internal errors (exit 2 from the CLI): {internal}"
    passed = sorted(r.name for r in results if r.passed)
    lost = sorted(set(record["passing"]) - set(passed))
    assert len(passed) >= record["passed"], f"pass count {len(passed)} < {record['passed']}; " \
                                            f"no longer passing: {lost}"


def _node_model(node, inputs, outputs, opset=17):
    from onnx import TensorProto, helper

    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in inputs.items()]
    rank = len(next(iter(inputs.values())).shape)  # the checker wants each output's rank
    out = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * rank) for n in outputs]
    return helper.make_model(helper.make_graph([node], "g", vi, out),
                             opset_imports=[helper.make_opsetid("", opset)])


def test_layer_normalization_mean_and_inv_std_dev_are_computed(tmp_path):
    # TVM's converter returned 0-d zeros for Mean/InvStdDev: silently wrong.
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 4)).astype(np.float32),
             "w": rng.standard_normal((3, 4)).astype(np.float32),
             "b": rng.standard_normal((3, 4)).astype(np.float32)}
    node = helper.make_node("LayerNormalization", ["x", "w", "b"], ["y", "mean", "inv"], axis=1)
    model = _node_model(node, feeds, ["y", "mean", "inv"])
    ref = ReferenceEvaluator(model).run(None, feeds)
    got = compile_and_run(model, feeds, tmp_path)
    assert [g.shape for g in got] == [r.shape for r in ref] == [(2, 3, 4), (2, 1, 1), (2, 1, 1)]
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


def test_unsupported_op_names_op_domain_opset_and_node():
    from onnx import TensorProto, helper

    from tvmopt.errors import UnsupportedOpError
    from tvmopt.frontend.importer import import_onnx

    node = helper.make_node("Frobnicate", ["x"], ["y"], name="frob_1", domain="com.example")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOpError) as err:
        import_onnx(model)
    msg = str(err.value)
    assert "com.example::Frobnicate" in msg and "frob_1" in msg and "opset 17" in msg
