"""BitCast, DFT and Det against onnx.reference.

Each case is a small ONNX graph built by tvmopt for the host CPU (in memory) and compared
with `onnx.reference.ReferenceEvaluator` or onnxruntime.
"""

from __future__ import annotations

from __future__ import annotations
import numpy as np
import pytest
from onnx import helper
from tvmopt.errors import TvmoptError
from tests.harness import check_node, run_tvmopt
from tests.models import node_model



# ---------------------------------------------------------------- BitCast / DFT

@pytest.mark.parametrize("src,dst", [(np.float32, np.int32), (np.int64, np.float64),
                                     (np.uint16, np.int16)])
def test_bitcast_reinterprets_bits(src, dst):
    x = np.array([[1.5, -2.0, 0.0], [3.25, 7.0, -0.5]]).astype(src)
    node = helper.make_node("BitCast", ["x"], ["y"], to=helper.np_dtype_to_tensor_dtype(np.dtype(dst)))
    model = node_model(node, {"x": x}, {}, ["y"], opset=26)
    got = run_tvmopt(model, {"x": x})[0]
    np.testing.assert_array_equal(got, x.view(dst))


@pytest.mark.parametrize("attrs,channels,length", [
    ({"axis": 1}, 1, None),                              # real input, full spectrum
    ({"axis": 2, "onesided": 1}, 1, None),               # rfft on another axis
    ({"axis": 1, "inverse": 1}, 2, None),                # complex inverse
    ({"axis": 1, "inverse": 1, "onesided": 1}, 2, None), # irfft
    ({"axis": 1}, 2, 12),                                # dft_length pads with zeros
    ({"axis": 1}, 1, 5),                                 # dft_length truncates
])
def test_dft_matches_reference(attrs, channels, length):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 8, 6, channels)).astype(np.float32)
    consts = {} if length is None else {"n": np.array(length, np.int64)}
    node = helper.make_node("DFT", ["x", "n" if length else ""], ["y"], **attrs)
    check_node(node, {"x": x}, consts, opset=19, rtol=1e-4, atol=1e-4)


def test_dft_runtime_axis_is_refused():
    from tvmopt.frontend.importer import import_onnx

    node = helper.make_node("DFT", ["x", "", "axis"], ["y"])
    feeds = {"x": np.zeros((1, 4, 1), np.float32), "axis": np.array(1, np.int64)}
    with pytest.raises(TvmoptError, match="DFT axis is computed at run time"):
        import_onnx(node_model(node, feeds, {}, ["y"], opset=20))


@pytest.mark.parametrize("shape", [(2, 2), (4, 3, 3), (2, 4, 4)])
def test_det_matches_reference(shape):
    x = np.random.default_rng(10).standard_normal(shape).astype(np.float32)
    check_node(helper.make_node("Det", ["x"], ["y"]), {"x": x}, opset=22, rtol=1e-4, atol=1e-5)


def test_det_of_large_matrix_is_refused():
    from tvmopt.frontend.importer import import_onnx

    feeds = {"x": np.zeros((6, 6), np.float32)}
    with pytest.raises(TvmoptError, match="Det of 6x6"):
        import_onnx(node_model(helper.make_node("Det", ["x"], ["y"]), feeds, {}, ["y"], opset=22))
