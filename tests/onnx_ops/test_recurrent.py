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

def _recurrent_case(op, direction, layout=0, seq_lens=False, peepholes=False, seed=0, size=5,
                    hidden=2, **attrs):
    rng = np.random.default_rng(seed)
    steps, batch = 4, 3
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    dirs = 2 if direction == "bidirectional" else 1
    x_shape = (batch, steps, size) if layout else (steps, batch, size)
    s_shape = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    f = np.float32
    feeds = {"X": rng.standard_normal(x_shape).astype(f)}
    # Wider layers get weights of a trained layer's scale (1/sqrt(fan-in)): with larger ones a
    # 64-unit recurrence is chaotic and any rounding difference grows without bound.
    w_scale, r_scale = (0.5, 0.5) if hidden == 2 else (size ** -0.5, hidden ** -0.5)
    consts = {"W": rng.standard_normal((dirs, gates * hidden, size)).astype(f) * w_scale,
              "R": rng.standard_normal((dirs, gates * hidden, hidden)).astype(f) * r_scale,
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
    # Unrolled, checked by onnx.reference (onnxruntime refuses layout 1): the slowest case.
    pytest.param("LSTM", "bidirectional", {"peepholes": True, "layout": 1},
                 marks=pytest.mark.slow),
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


def _symbolic(model, layout=0):
    """The model's sequence and batch dims made symbolic (states keep their batch dim named)."""
    seq_axis, batch_axis = (1, 0) if layout else (0, 1)
    for inp in model.graph.input:
        dims = inp.type.tensor_type.shape.dim
        if inp.name == "X":
            dims[seq_axis].dim_param = "seq"
            dims[batch_axis].dim_param = "batch"
        elif inp.name == "sequence_lens":
            dims[0].dim_param = "batch"
        elif inp.name in ("initial_h", "initial_c"):
            dims[0 if layout else 1].dim_param = "batch"
    return model


def _feeds_at(op, direction, steps, batch, layout=0, lens=None, seed=0, size=5, hidden=2):
    rng = np.random.default_rng(seed + steps)
    dirs = 2 if direction == "bidirectional" else 1
    f = np.float32
    feeds = {"X": rng.standard_normal((batch, steps, size) if layout else (steps, batch, size))
             .astype(f)}
    if lens is not None:
        feeds["sequence_lens"] = np.asarray(lens, np.int32)
    s_shape = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    feeds["initial_h"] = rng.standard_normal(s_shape).astype(f)
    if op == "LSTM":
        feeds["initial_c"] = rng.standard_normal(s_shape).astype(f)
    return feeds


@pytest.mark.parametrize("op,direction,kw", [
    ("RNN", "reverse", {"activations": ["Relu"]}),
    # The directions of one kernel with activations of their own.
    ("RNN", "bidirectional", {"activations": ["Relu", "Tanh"]}),
    ("GRU", "forward", {"activations": ["HardSigmoid", "Softsign"], "activation_alpha": [0.3],
                        "activation_beta": [0.4], "clip": 1.5}),
    ("GRU", "bidirectional", {"linear_before_reset": 1, "layout": 1}),
    # The slowest cases (both directions' full LSTM with sequence_lens); the split form's
    # LSTM case below covers the same in the default tier.
    pytest.param("LSTM", "bidirectional", {"peepholes": True, "seq_lens": True},
                 marks=pytest.mark.slow),
    ("LSTM", "forward", {"input_forget": 1, "clip": 2.0}),  # onnx.reference ignores input_forget
    ("LSTM", "reverse", {"layout": 1}),
    # Hidden sizes past a vector: the kernel's register-blocked matmul and vectorized gates
    # with their ragged tails (20 units: 80 gate columns = one 64-column block + 16).
    pytest.param("LSTM", "bidirectional",
                 {"hidden": 20, "size": 9, "seq_lens": True, "peepholes": True},
                 marks=pytest.mark.slow),
    ("GRU", "forward", {"hidden": 48, "size": 7}),
    ("GRU", "reverse", {"hidden": 37, "size": 3, "linear_before_reset": 1}),
    ("RNN", "forward", {"hidden": 64, "size": 16}),
])
def test_symbolic_sequence_length_loops_at_run_time(op, direction, kw):
    """One build (the loop kernel: --dispatch codegen) run at several lengths and batches."""
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.pipeline import PipelineConfig
    from tvmopt.runtime.in_memory import build_in_memory, run_executable

    layout = kw.get("layout", 0)
    model, _ = _recurrent_case(op, direction, **kw)
    imported = import_onnx(_symbolic(model, layout))
    exe = build_in_memory(imported.mod, None, PipelineConfig(dispatch="codegen"))
    names = [i.name for i in imported.inputs]
    # Batches of one, of whole blocks of rows and with a partial block.
    for steps, batch, lens in [(7, 2, [7, 3]), (1, 3, [1, 0, 1]), (33, 1, [20]),
                               (5, 5, [5, 2, 0, 5, 3])]:
        feeds = _feeds_at(op, direction, steps, batch, layout,
                          lens if kw.get("seq_lens") else None, size=kw.get("size", 5),
                          hidden=kw.get("hidden", 2))
        want = (ReferenceEvaluator(model).run(None, feeds) if layout
                else run_onnxruntime(model, feeds))
        got = run_executable(exe, [feeds[n] for n in names])
        for g, e in zip(got, want, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,direction,kw", [
    # the longest case: the other three keep the split form in the default tier
    pytest.param("LSTM", "bidirectional",
                 {"hidden": 16, "size": 9, "seq_lens": True, "peepholes": True},
                 marks=pytest.mark.slow),
    ("GRU", "reverse", {"hidden": 32, "size": 5, "seq_lens": True}),
    ("GRU", "bidirectional", {"hidden": 16, "size": 3, "linear_before_reset": 1, "layout": 1}),
    ("RNN", "forward", {"hidden": 16, "size": 4, "activations": ["Relu"]}),
])
def test_loop_kernel_split_over_hidden_units(op, direction, kw, monkeypatch):
    """The form for a large R (hidden units split across the threads at every step, the state
    alternating between two buffers), forced on small cases: the same results at every
    length and batch (rows in whole and partial blocks, sequences that end early or have no
    steps)."""
    from tvmopt.frontend.onnx_ops import rnn_loop

    monkeypatch.setattr(rnn_loop, "_SPLIT_MIN", 0)
    test_symbolic_sequence_length_loops_at_run_time(op, direction, kw)
