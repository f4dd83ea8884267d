"""Resize with scales or sizes given at run time; one artifact for many scales.

Each case is a small ONNX graph built by tvmopt for the host CPU (in memory) and compared
with `onnx.reference.ReferenceEvaluator` or onnxruntime.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from tests.harness import check_against_reference, run_tvmopt
from tests.models import graph_model



# ---- Resize with operands given at run time ----------------------------------------------

@pytest.mark.parametrize("attrs,scales", [
    ({"mode": "linear"}, [1.0, 1.0, 0.6, 1.7]),
    ({"mode": "cubic", "antialias": 1}, [1.0, 1.0, 0.5, 0.75]),
    ({"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, [1.0, 1.0, 1.5, 2.0]),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil",
      "coordinate_transformation_mode": "asymmetric"}, [1.0, 1.0, 2.5, 0.5]),
])
def test_resize_run_time_scales(attrs, scales):
    rng = np.random.default_rng(5)
    feeds = {"x": rng.random((1, 2, 4, 6), dtype=np.float32),
             "scales": np.array(scales, dtype=np.float32)}
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    check_against_reference(graph_model(node, feeds, ["y"]), feeds)


def test_resize_run_time_sizes_keep_aspect_and_roi():
    rng = np.random.default_rng(6)
    feeds = {"x": rng.random((1, 1, 4, 5), dtype=np.float32),
             "sizes": np.array([7, 9], dtype=np.int64)}
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear", axes=[2, 3],
                            keep_aspect_ratio_policy="not_larger")
    check_against_reference(graph_model(node, feeds, ["y"]), feeds)
    feeds = {"x": feeds["x"], "roi": np.array([0.2, -0.1, 0.9, 1.3], dtype=np.float32),
             "sizes": np.array([3, 6], dtype=np.int64)}
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="linear",
                            axes=[2, 3], coordinate_transformation_mode="tf_crop_and_resize",
                            extrapolation_value=-1.0)
    check_against_reference(graph_model(node, feeds, ["y"]), feeds)


def test_resize_one_artifact_runs_other_scales():
    # The output shape is bound when the artifact runs: one build, two different scales.
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import build_in_memory, run_executable

    x = np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    model = graph_model(node, {"x": x, "scales": np.ones(4, np.float32)}, ["y"])
    ex = build_in_memory(import_onnx(model).mod)
    for scales in ([1, 1, 2, 2], [1, 1, 1, 0.5]):
        s = np.array(scales, dtype=np.float32)
        want = ReferenceEvaluator(model).run(None, {"x": x, "scales": s})[0]
        got = run_executable(ex, [x, s])[0]
        np.testing.assert_array_equal(got, want)


def test_torch_upsample_to_skip_size_with_dynamic_batch():
    # U-Net/FPN style: F.interpolate(x, size=y.shape[-2:]) exports sizes as
    # Concat(Shape(x)[:2], Shape(y)[2:]); with a symbolic batch that is a symbolic shape.
    torch = pytest.importorskip("torch")
    import io

    class Up(torch.nn.Module):
        def forward(self, x, y):
            return torch.nn.functional.interpolate(x, size=y.shape[-2:], mode="bilinear") + y

    x, y = torch.randn(2, 3, 5, 6), torch.randn(2, 3, 10, 12)
    buf = io.BytesIO()
    torch.onnx.export(Up(), (x, y), buf, dynamo=False, opset_version=18, input_names=["x", "y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    model = onnx.load_from_string(buf.getvalue())
    assert "Shape" in {n.op_type for n in model.graph.node}
    feeds = {"x": np.random.default_rng(7).random((3, 3, 5, 6), dtype=np.float32),
             "y": np.random.default_rng(8).random((3, 3, 10, 12), dtype=np.float32)}
    import onnxruntime as ort

    want = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"]).run(
        None, feeds)[0]
    got = run_tvmopt(model, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_upsample_opset9_scales_input():
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    feeds = {"x": x, "scales": np.array([1, 1, 2, 3], dtype=np.float32)}
    node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode="nearest")
    check_against_reference(graph_model(node, feeds, ["y"], opset=9), feeds)
