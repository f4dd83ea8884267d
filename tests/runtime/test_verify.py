"""Tolerance arithmetic of --verify, on hand-made arrays."""

import numpy as np
import pytest

from tvmopt.errors import VerificationError
from tvmopt.runtime.verify import Tolerance, check, compare


def test_within_tolerance_passes_and_reports_errors():
    ref = {"y": np.array([1.0, 2.0, -4.0], np.float32)}
    got = {"y": np.array([1.0, 2.001, -4.0], np.float32)}
    errs = compare(got, ref, Tolerance(atol=1e-4, rtol=1e-3))
    assert errs[0].mismatched == 0
    assert errs[0].max_abs == pytest.approx(1e-3, rel=1e-3)
    assert errs[0].max_rel == pytest.approx(5e-4, rel=1e-3)
    check(errs, Tolerance())


def test_past_tolerance_fails_naming_the_output():
    ref = {"logits": np.zeros((2, 3), np.float32)}
    got = {"logits": np.full((2, 3), 0.5, np.float32)}
    tol = Tolerance(atol=1e-4, rtol=1e-3)
    errs = compare(got, ref, tol)
    assert errs[0].mismatched == 6
    with pytest.raises(VerificationError, match="output 'logits' differs .* 6/6 elements"):
        check(errs, tol)


def test_nan_only_matches_nan_and_shape_mismatch_is_an_error():
    ref = {"y": np.array([np.nan, 1.0], np.float32)}
    assert compare({"y": np.array([np.nan, 1.0], np.float32)}, ref, Tolerance())[0].mismatched == 0
    assert compare({"y": np.array([0.0, 1.0], np.float32)}, ref, Tolerance())[0].mismatched == 1
    with pytest.raises(VerificationError, match="shape"):
        compare({"y": np.zeros(3, np.float32)}, ref, Tolerance())


def test_integer_outputs_compare_exactly():
    ref = {"idx": np.array([1, 2, 3])}
    assert compare({"idx": np.array([1, 2, 3])}, ref, Tolerance())[0].mismatched == 0
    assert compare({"idx": np.array([1, 2, 4])}, ref, Tolerance())[0].mismatched == 1


def test_reference_failure_is_one_verification_error(tmp_path):
    """A model onnxruntime cannot run on the given inputs fails verification by name."""
    import onnx
    from onnx import TensorProto, helper

    from tvmopt.runtime.verify import run_onnxruntime

    # Reshape to a fixed 4 elements: fine for a [2, 2] input, impossible for [3, 2]
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [onnx.numpy_helper.from_array(np.array([4], np.int64), "s")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert run_onnxruntime(str(path), {"x": np.ones((2, 2), np.float32)})["y"].shape == (4,)
    with pytest.raises(VerificationError, match=r"onnxruntime, cannot run .* x\[3, 2\]"):
        run_onnxruntime(str(path), {"x": np.ones((3, 2), np.float32)})
