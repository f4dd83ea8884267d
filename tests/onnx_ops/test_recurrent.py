"""RNN, GRU and LSTM against onnxruntime or onnx.reference.

Each case is a small ONNX graph built by tvmopt for the host CPU (in memory) and compared
with `onnx.reference.ReferenceEvaluator` or onnxruntime.
"""

from __future__ import annotations

from __future__ import annotations
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from tvmopt.errors import TvmoptError
from tests.harness import run_onnxruntime, run_tvmopt
from tests.models import node_model



# ---------------------------------------------------------------- RNN / GRU / LSTM

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
    return node_model(node, feeds, consts, outputs, opset=14, out_type=TensorProto.FLOAT), feeds


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
    want = ReferenceEvaluator(model).run(None, feeds) if kw.get("layout") else run_onnxruntime(model, feeds)
    got = run_tvmopt(model, feeds)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_recurrent_sequence_lens_masks_past_each_end(op):
    model, feeds = _recurrent_case(op, "bidirectional", seq_lens=True, seed=5)
    want = run_onnxruntime(model, feeds)
    got = run_tvmopt(model, feeds)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    assert not got[0][2:, :, 1].any()  # batch entry 1 has 2 steps: rows past them are zero


def test_recurrent_activation_attributes():
    model, feeds = _recurrent_case("GRU", "forward", seed=7, activations=["HardSigmoid", "Softsign"],
                                   activation_alpha=[0.3], activation_beta=[0.4])
    want = run_onnxruntime(model, feeds)  # onnx.reference ignores `activations`
    got = run_tvmopt(model, feeds)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_recurrent_symbolic_sequence_length_is_refused():
    model, _ = _recurrent_case("LSTM", "forward")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "seq"
    from tvmopt.frontend.importer import import_onnx

    with pytest.raises(TvmoptError, match="LSTM.*static sequence length"):
        import_onnx(model)
