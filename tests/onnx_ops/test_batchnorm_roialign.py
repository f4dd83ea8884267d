"""BatchNormalization in training mode (computed, not the running stats) and RoiAlign max (refused)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.harness import check_against_reference
from tests.models import graph_model


def _bn_feeds(shape=(3, 4, 5, 2)):
    rng = np.random.default_rng(0)
    c = shape[1]
    return ({"x": (rng.standard_normal(shape) * 3 + 1).astype("float32")},
            {"s": rng.random(c).astype("float32") + 0.5, "b": rng.standard_normal(c).astype("float32"),
             "m": rng.standard_normal(c).astype("float32"), "v": rng.random(c).astype("float32") + 0.1})


@pytest.mark.parametrize("outputs", [["y"], ["y", "rm", "rv"]])
def test_batchnorm_training_mode_uses_batch_statistics(outputs):
    feeds, consts = _bn_feeds()
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outputs,
                            training_mode=1, momentum=0.8, epsilon=1e-3)
    got = check_against_reference(graph_model(node, feeds, outputs, consts, opset=15), feeds, rtol=1e-4, atol=1e-5)
    # the running statistics would give other numbers: the check above is not vacuous
    inference = (feeds["x"] - consts["m"][None, :, None, None]) / np.sqrt(
        consts["v"][None, :, None, None] + 1e-3)
    assert not np.allclose(got[0], inference * consts["s"][None, :, None, None]
                           + consts["b"][None, :, None, None], atol=1e-2)


def test_batchnorm_inference_mode_still_tvm_s_converter():
    feeds, consts = _bn_feeds((2, 4, 3))
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])
    check_against_reference(graph_model(node, feeds, ["y"], consts, opset=15), feeds, rtol=1e-4, atol=1e-5)


def test_roialign_max_mode_is_refused_by_name():
    from tvmopt.errors import TvmoptError
    from tvmopt.frontend.importer import import_onnx

    feeds = {"x": np.zeros((1, 1, 8, 8), "float32"), "rois": np.zeros((1, 4), "float32"),
             "idx": np.zeros((1,), "int64")}
    node = helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], mode="max",
                            output_height=2, output_width=2)
    with pytest.raises(TvmoptError, match="RoiAlign mode 'max' is not supported"):
        import_onnx(graph_model(node, feeds, ["y"], opset=16))
