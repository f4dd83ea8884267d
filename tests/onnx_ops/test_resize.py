"""Resize: modes, int8, rank 2, symbolic batch, run-time scales refused by name.

Each case is a small ONNX graph built by tvmopt for the host CPU (in memory) and compared
with `onnx.reference.ReferenceEvaluator` or onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from tvmopt.errors import ImportFailure
from tests.harness import check_single_output
from tests.models import single_output_model



# ---- Resize --------------------------------------------------------------------------------

def _resize(feeds_x, scales=None, sizes=None, roi=None, **attrs):
    consts = {"roi": np.array([] if roi is None else roi, "float32")}
    names = ["x", "roi"]
    if scales is not None:
        consts["scales"] = np.array(scales, "float32")
        names.append("scales")
    else:
        names += ["", "sizes"]
        consts["sizes"] = np.array(sizes, "int64")
    return helper.make_node("Resize", names, ["y"], **attrs), consts


@pytest.mark.parametrize("attrs,scales,sizes,roi", [
    (dict(mode="cubic", antialias=1), [1, 1, 0.6, 0.6], None, None),
    (dict(mode="linear", antialias=1), None, [1, 1, 3, 3], None),
    (dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1), [1, 1, 1.7, 2.3], None, None),
    (dict(mode="linear", coordinate_transformation_mode="half_pixel_symmetric"),
     [1, 1, 2.3, 0.7], None, None),
    (dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
          extrapolation_value=10.0), None, [1, 1, 3, 3], [0, 0, 0.4, 0.6, 1, 1, 1.2, 1.7]),
    (dict(mode="nearest", keep_aspect_ratio_policy="not_larger", axes=[2, 3]),
     None, [7, 8], None),
    (dict(mode="nearest", nearest_mode="ceil", coordinate_transformation_mode="align_corners"),
     [1, 1, 2, 3], None, None),
])
def test_resize_matches_reference(attrs, scales, sizes, roi):
    x = np.random.default_rng(1).standard_normal((1, 2, 4, 5)).astype("float32")
    node, consts = _resize(x, scales, sizes, roi, **attrs)
    check_single_output(node, {"x": x}, consts)


def test_resize_int8_nearest_and_rank2():
    x = np.arange(-12, 12, dtype="int8").reshape(4, 6)
    node, consts = _resize(x, scales=[2, 0.5], mode="nearest")
    check_single_output(node, {"x": x}, consts, out_dtype=TensorProto.INT8)


def test_resize_symbolic_batch_passes_through():
    x = np.random.default_rng(2).standard_normal((2, 3, 4, 4)).astype("float32")
    node, consts = _resize(x, scales=[1, 1, 2, 2], mode="linear")
    check_single_output(node, {"x": x}, consts, input_shapes={"x": ["batch", 3, 4, 4]})


def test_resize_run_time_scales_on_symbolic_dim_refused_by_name():
    # Run-time scales are supported (test_resize_run_time.py) when the resized dims are static.
    x = np.zeros((1, 1, 2, 2), "float32")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up1", mode="nearest")
    model = single_output_model(node, {"x": x, "scales": np.ones(4, "float32")}, {},
                   input_shapes={"x": ["batch", 1, 2, 2]})
    from tvmopt.errors import ShapeError
    from tvmopt.frontend.importer import import_onnx

    with pytest.raises((ImportFailure, ShapeError), match=r"up1.*dimension 0.*symbolic"):
        import_onnx(model)
