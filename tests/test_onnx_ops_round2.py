"""Converters of issue 3, round two: int8 ops, RNN/GRU/LSTM, each checked against onnx.reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tvmopt.errors import TvmoptError

_NP_TO_ONNX = {np.dtype(k): v for k, v in {
    "float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8, "int32": TensorProto.INT32, "int64": TensorProto.INT64,
    "uint16": TensorProto.UINT16}.items()}


def _model(node, feeds: dict, consts: dict, outputs: list[str], opset: int = 21,
           out_type: int = TensorProto.UNDEFINED):
    """A one-node model: `feeds` are graph inputs, `consts` initializers."""
    inputs = [helper.make_tensor_value_info(k, _NP_TO_ONNX[v.dtype], v.shape) for k, v in feeds.items()]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    outs = [helper.make_tensor_value_info(o, out_type, None) for o in outputs]
    graph = helper.make_graph([node], "g", inputs, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _run_tvmopt(model, feeds: dict) -> list[np.ndarray]:
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx

    imported = import_onnx(model)
    ex = pipeline.build(imported.mod, tvm.target.Target({"kind": "llvm", "num-cores": 1}), "cpu")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [o.numpy() for o in out]


def _check(node, feeds, consts=None, outputs=("y",), opset=21, rtol=1e-5, atol=1e-5):
    consts = consts or {}
    model = _model(node, feeds, consts, list(outputs), opset)
    expected = ReferenceEvaluator(model).run(None, feeds)
    got = _run_tvmopt(model, feeds)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    return got


# ---------------------------------------------------------------- int8 ops

def test_qlinearmatmul_per_row_and_column_zero_points():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, (3, 5), dtype=np.uint8)
    b = rng.integers(0, 255, (5, 4), dtype=np.uint8)
    feeds = {"a": a, "b": b}
    consts = {"a_scale": np.array([0.02, 0.05, 0.1], np.float32),
              "a_zp": np.array([120, 128, 3], np.uint8),
              "b_scale": np.array([0.01, 0.03, 0.2, 0.04], np.float32),
              "b_zp": np.array([1, 200, 128, 7], np.uint8),
              "y_scale": np.array(0.9, np.float32), "y_zp": np.array(10, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp",
                                              "y_scale", "y_zp"], ["y"])
    # onnx.reference cannot broadcast a per-row [M] zero point; compute the spec by hand.
    c = consts
    acc = (a.astype(np.int32) - c["a_zp"].astype(np.int32)[:, None]) @ \
        (b.astype(np.int32) - c["b_zp"].astype(np.int32))
    want = np.rint(acc * (c["a_scale"][:, None] * c["b_scale"] / c["y_scale"])) + 10
    want = np.clip(want, 0, 255).astype(np.uint8)
    got = _run_tvmopt(_model(node, feeds, consts, ["y"]), feeds)[0]
    np.testing.assert_array_equal(got, want)
    # Negative results occur, so saturation at 0 is exercised too.
    assert got.min() == 0


def test_qlinearmatmul_per_column_zero_point():
    rng = np.random.default_rng(4)
    feeds = {"a": rng.integers(0, 255, (3, 5), dtype=np.uint8)}
    consts = {"a_scale": np.array(0.02, np.float32), "a_zp": np.array(128, np.uint8),
              "b": rng.integers(0, 255, (5, 4), dtype=np.uint8),
              "b_scale": np.array([0.01, 0.03, 0.2, 0.04], np.float32),
              "b_zp": np.array([1, 200, 128, 7], np.uint8),
              "y_scale": np.array(0.3, np.float32), "y_zp": np.array(10, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp",
                                              "y_scale", "y_zp"], ["y"])
    _check(node, feeds, consts, atol=0)


def test_qlinearmatmul_int8_batched_runtime_scales():
    rng = np.random.default_rng(1)
    feeds = {"a": rng.integers(-128, 127, (2, 3, 6), dtype=np.int8),
             "a_scale": np.array(0.03, np.float32), "a_zp": np.array(-5, np.int8),
             "b": rng.integers(-128, 127, (6, 4), dtype=np.int8),
             "b_scale": np.array(0.02, np.float32), "b_zp": np.array(4, np.int8),
             "y_scale": np.array(0.5, np.float32), "y_zp": np.array(-3, np.int8)}
    node = helper.make_node("QLinearMatMul", list(feeds), ["y"])
    _check(node, feeds, atol=0)


def test_round_half_to_even():
    # acc * multiplier lands exactly on .5: ONNX rounds to even (2.5 -> 2, 3.5 -> 4).
    feeds = {"a": np.array([[5], [7], [9]], np.uint8)}
    consts = {"a_scale": np.array(1.0, np.float32), "a_zp": np.array(0, np.uint8),
              "b": np.array([[1]], np.uint8),
              "b_scale": np.array(0.5, np.float32), "b_zp": np.array(0, np.uint8),
              "y_scale": np.array(1.0, np.float32), "y_zp": np.array(0, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp",
                                              "y_scale", "y_zp"], ["y"])
    got = _check(node, feeds, consts, atol=0)
    assert got[0].ravel().tolist() == [2, 4, 4]


def test_convinteger_per_channel_weight_zero_point():
    rng = np.random.default_rng(2)
    feeds = {"x": rng.integers(0, 255, (1, 2, 5, 5), dtype=np.uint8)}
    consts = {"w": rng.integers(0, 255, (3, 2, 3, 3), dtype=np.uint8),
              "x_zp": np.array(100, np.uint8), "w_zp": np.array([1, 128, 250], np.uint8)}
    node = helper.make_node("ConvInteger", ["x", "w", "x_zp", "w_zp"], ["y"], pads=[1, 1, 1, 1])
    _check(node, feeds, consts, opset=10, atol=0)


def test_qlinearconv_per_channel_scale_and_bias():
    rng = np.random.default_rng(3)
    feeds = {"x": rng.integers(-128, 127, (1, 2, 6, 6), dtype=np.int8)}
    consts = {"x_scale": np.array(0.05, np.float32), "x_zp": np.array(2, np.int8),
              "w": rng.integers(-128, 127, (4, 2, 3, 3), dtype=np.int8),
              "w_scale": np.array([0.01, 0.02, 0.005, 0.03], np.float32),
              "w_zp": np.array([0, 0, 0, 0], np.int8),
              "y_scale": np.array(0.25, np.float32), "y_zp": np.array(-1, np.int8),
              "bias": rng.integers(-500, 500, (4,), dtype=np.int32)}
    node = helper.make_node("QLinearConv", list(["x"] + list(consts)), ["y"],
                            strides=[2, 2], pads=[1, 0, 1, 0])
    _check(node, feeds, consts, opset=10, atol=0)


# ---------------------------------------------------------------- RNN / GRU / LSTM

def _ort(model, feeds):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _recurrent_case(op, direction, layout=0, seq_lens=False, peepholes=False, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    steps, batch, size, hidden = 4, 3, 5, 2
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    dirs = 2 if direction == "bidirectional" else 1
    x_shape = (batch, steps, size) if layout else (steps, batch, size)
    s_shape = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    f = np.float32
    feeds = {"X": rng.standard_normal(x_shape).astype(f)}
    consts = {"W": rng.standard_normal((dirs, gates * hidden, size)).astype(f) * 0.5,
              "R": rng.standard_normal((dirs, gates * hidden, hidden)).astype(f) * 0.5,
              "B": rng.standard_normal((dirs, 2 * gates * hidden)).astype(f) * 0.1}
    names = ["X", "W", "R", "B", "", "initial_h"]
    if seq_lens:
        feeds["sequence_lens"] = np.array([4, 2, 1], np.int32)
        names[4] = "sequence_lens"
    feeds["initial_h"] = rng.standard_normal(s_shape).astype(f)
    outputs = ["Y", "Y_h"]
    if op == "LSTM":
        feeds["initial_c"] = rng.standard_normal(s_shape).astype(f)
        names.append("initial_c")
        outputs.append("Y_c")
        if peepholes:
            consts["P"] = rng.standard_normal((dirs, 3 * hidden)).astype(f)
            names.append("P")
    node = helper.make_node(op, names, outputs, hidden_size=hidden, direction=direction,
                            layout=layout, **attrs)
    return _model(node, feeds, consts, outputs, opset=14, out_type=TensorProto.FLOAT), feeds


@pytest.mark.parametrize("op,direction,kw", [
    ("RNN", "reverse", {}),
    ("RNN", "bidirectional", {"layout": 1}),
    ("GRU", "forward", {}),
    ("GRU", "bidirectional", {"linear_before_reset": 1, "layout": 1}),
    ("LSTM", "forward", {"peepholes": True}),
    ("LSTM", "bidirectional", {"peepholes": True, "layout": 1}),
])
def test_recurrent_matches_onnxruntime_or_reference(op, direction, kw):
    model, feeds = _recurrent_case(op, direction, **kw)
    # onnxruntime refuses layout=1 (batch-major); onnx.reference implements it.
    want = ReferenceEvaluator(model).run(None, feeds) if kw.get("layout") else _ort(model, feeds)
    got = _run_tvmopt(model, feeds)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_recurrent_sequence_lens_masks_past_each_end(op):
    model, feeds = _recurrent_case(op, "bidirectional", seq_lens=True, seed=5)
    want = _ort(model, feeds)
    got = _run_tvmopt(model, feeds)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    assert not got[0][2:, :, 1].any()  # batch entry 1 has 2 steps: rows past them are zero


def test_recurrent_activation_attributes():
    model, feeds = _recurrent_case("GRU", "forward", seed=7, activations=["HardSigmoid", "Softsign"],
                                   activation_alpha=[0.3], activation_beta=[0.4])
    want = _ort(model, feeds)  # onnx.reference ignores `activations`
    got = _run_tvmopt(model, feeds)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_recurrent_symbolic_sequence_length_is_refused():
    model, _ = _recurrent_case("LSTM", "forward")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    from tvmopt.frontend.importer import import_onnx

    with pytest.raises(TvmoptError, match="LSTM.*static sequence length"):
        import_onnx(model)


# ---------------------------------------------------------------- Scan / Loop

def _scan_body():
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Add", ["sum_in", "next"], ["sum_out"]),
             helper.make_node("Mul", ["next", "sum_out"], ["scan_out"])]
    return helper.make_graph(nodes, "body",
                             [helper.make_tensor_value_info("sum_in", f, [2]),
                              helper.make_tensor_value_info("next", f, [2])],
                             [helper.make_tensor_value_info("sum_out", f, [2]),
                              helper.make_tensor_value_info("scan_out", f, [2])])


@pytest.mark.parametrize("axes,directions", [
    ({}, {}),
    ({"scan_input_axes": [1], "scan_output_axes": [1]},
     {"scan_input_directions": [1], "scan_output_directions": [1]}),
])
def test_scan_unrolled_matches_onnxruntime(axes, directions):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 2) if not axes else (2, 3)).astype(np.float32)
    feeds = {"init": rng.standard_normal(2).astype(np.float32), "x": x}
    node = helper.make_node("Scan", ["init", "x"], ["y", "z"], body=_scan_body(),
                            num_scan_inputs=1, **axes, **directions)
    model = _model(node, feeds, {}, ["y", "z"], opset=16, out_type=TensorProto.FLOAT)
    # onnx.reference implements no reversed directions: compare with onnxruntime.
    for g, e in zip(_run_tvmopt(model, feeds), _ort(model, feeds), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6)


def _loop_model(trip_count_const: bool):
    f, i64, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=f),
         helper.make_node("Mul", ["acc_in", "i_f"], ["scaled"]),
         helper.make_node("Add", ["scaled", "x"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["each"])],
        "body",
        [helper.make_tensor_value_info("i", i64, []), helper.make_tensor_value_info("cond_in", b, []),
         helper.make_tensor_value_info("acc_in", f, [3])],
        [helper.make_tensor_value_info("cond_out", b, []),
         helper.make_tensor_value_info("acc_out", f, [3]),
         helper.make_tensor_value_info("each", f, [3])])
    node = helper.make_node("Loop", ["M", "", "acc0"], ["acc", "all"], body=body)
    feeds = {"x": np.array([1.0, -2.0, 0.5], np.float32), "acc0": np.ones(3, np.float32)}
    consts = {"M": np.array(4, np.int64)}
    if not trip_count_const:
        feeds = {"M": consts.pop("M"), **feeds}
    inputs = [helper.make_tensor_value_info(k, _NP_TO_ONNX[v.dtype], v.shape) for k, v in feeds.items()]
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("acc", f, None),
                               helper.make_tensor_value_info("all", f, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 10
    return model, feeds


def test_loop_with_constant_trip_count_unrolled():
    model, feeds = _loop_model(trip_count_const=True)
    want = _ort(model, feeds)  # onnx.reference fails on a Loop without `cond`
    got = _run_tvmopt(model, feeds)
    assert got[1].shape == (4, 3)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6)


def test_loop_with_runtime_trip_count_is_refused():
    from tvmopt.frontend.importer import import_onnx

    model, _ = _loop_model(trip_count_const=False)
    with pytest.raises(TvmoptError, match="Loop.*trip count M is computed at run time"):
        import_onnx(model)


# ---------------------------------------------------------------- BitCast / DFT

@pytest.mark.parametrize("src,dst", [(np.float32, np.int32), (np.int64, np.float64),
                                     (np.uint16, np.int16)])
def test_bitcast_reinterprets_bits(src, dst):
    x = np.array([[1.5, -2.0, 0.0], [3.25, 7.0, -0.5]]).astype(src)
    node = helper.make_node("BitCast", ["x"], ["y"], to=helper.np_dtype_to_tensor_dtype(np.dtype(dst)))
    model = _model(node, {"x": x}, {}, ["y"], opset=26)
    got = _run_tvmopt(model, {"x": x})[0]
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
    _check(node, {"x": x}, consts, opset=19, rtol=1e-4, atol=1e-4)


def test_dft_runtime_axis_is_refused():
    from tvmopt.frontend.importer import import_onnx

    node = helper.make_node("DFT", ["x", "", "axis"], ["y"])
    feeds = {"x": np.zeros((1, 4, 1), np.float32), "axis": np.array(1, np.int64)}
    with pytest.raises(TvmoptError, match="DFT axis is computed at run time"):
        import_onnx(_model(node, feeds, {}, ["y"], opset=20))


@pytest.mark.parametrize("shape", [(2, 2), (4, 3, 3), (2, 4, 4)])
def test_det_matches_reference(shape):
    x = np.random.default_rng(10).standard_normal(shape).astype(np.float32)
    _check(helper.make_node("Det", ["x"], ["y"]), {"x": x}, opset=22, rtol=1e-4, atol=1e-5)


def test_det_of_large_matrix_is_refused():
    from tvmopt.frontend.importer import import_onnx

    feeds = {"x": np.zeros((6, 6), np.float32)}
    with pytest.raises(TvmoptError, match="Det of 6x6"):
        import_onnx(_model(helper.make_node("Det", ["x"], ["y"]), feeds, {}, ["y"], opset=22))
