"""Reductions over all -inf, run-time axes, windows of run-time size.

Each case is a small ONNX graph built by tvmopt for the host CPU (in memory) and compared
with `onnx.reference.ReferenceEvaluator` or onnxruntime.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np
import pytest
from onnx import helper
from tests.harness import check_against_reference
from tests.models import graph_model



# ---- Reductions over all -inf, symbolic dims defined by match_cast -----------------------

def test_reduce_max_of_only_minus_inf_is_minus_inf():
    x = np.array([[-np.inf, -np.inf], [1.0, -np.inf]], dtype=np.float32)
    feeds = {"x": x}
    node = helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=0)
    got = check_against_reference(graph_model(node, feeds, ["y"], consts={"axes": np.array([1])}), feeds)[0]
    assert np.isneginf(got[0]) and got[1] == 1.0


def test_reduce_min_with_run_time_axes_builds():
    # run-time axes bind fresh dims in a match_cast; FuseOps used to emit a kernel before it
    feeds = {"x": np.array([[np.inf, np.inf], [1.0, 2.0]], dtype=np.float32),
             "axes": np.array([1], dtype=np.int64)}
    node = helper.make_node("ReduceMin", ["x", "axes"], ["y"], keepdims=1)
    got = check_against_reference(graph_model(node, feeds, ["y"]), feeds)[0]
    assert np.isposinf(got[0, 0])


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
def test_window_with_run_time_size_builds(op):
    feeds = {"size": np.array(10, dtype=np.int32)}
    node = helper.make_node(op, ["size"], ["y"], periodic=0)
    check_against_reference(graph_model(node, feeds, ["y"], opset=17), feeds)
