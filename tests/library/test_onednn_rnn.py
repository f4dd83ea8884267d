"""Whole LSTM / GRU / RNN nodes on oneDNN's RNN primitives (library.onednn.lower_recurrent,
through the pipeline's --dispatch library path), against onnxruntime or onnx.reference: both
directions, sequence_lens (grouped by length, including 0), initial states present or not,
batch-major layout, peepholes, GRU linear_before_reset both ways; what stays on the unrolled
body (clip, other activations) and the timing choice between the two."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tests.harness import run_onnxruntime
from tests.models import node_model

from tests.onednn_required import require_onednn
from tvmopt.library import onednn as od
TOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def extension():
    require_onednn()


def case(op, direction="forward", layout=0, lens=None, states=True, bias=True, peepholes=False,
         steps=5, batch=3, size=4, hidden=3, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    dirs = 2 if direction == "bidirectional" else 1
    f = np.float32
    feeds = {"X": rng.standard_normal((batch, steps, size) if layout else (steps, batch, size))
             .astype(f)}
    consts = {"W": (rng.standard_normal((dirs, gates * hidden, size)) * 0.5).astype(f),
              "R": (rng.standard_normal((dirs, gates * hidden, hidden)) * 0.5).astype(f)}
    names = ["X", "W", "R", "", "", "", "", ""]
    if bias:
        consts["B"] = (rng.standard_normal((dirs, 2 * gates * hidden)) * 0.3).astype(f)
        names[3] = "B"
    if lens is not None:
        feeds["sequence_lens"] = np.asarray(lens, np.int32)
        names[4] = "sequence_lens"
    s_shape = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    if states:
        feeds["initial_h"] = rng.standard_normal(s_shape).astype(f)
        names[5] = "initial_h"
        if op == "LSTM":
            feeds["initial_c"] = rng.standard_normal(s_shape).astype(f)
            names[6] = "initial_c"
    if peepholes:
        consts["P"] = rng.standard_normal((dirs, 3 * hidden)).astype(f)
        names[7] = "P"
    while names and names[-1] == "":
        names.pop()
    outputs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outputs, hidden_size=hidden, direction=direction,
                            layout=layout, **attrs)
    return node_model(node, feeds, consts, outputs, opset=14, out_type=TensorProto.FLOAT), feeds


def build(model, dispatch="library"):
    """(module after the dispatch phase, outputs of the built module on the feeds' order)."""
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    target = host_target().to_tvm()
    imported = import_onnx(model)
    cfg = pipeline.PipelineConfig(dispatch=dispatch)
    optimized = pipeline.optimize(imported.mod, target, cfg, until="dispatch")
    mod = optimized.mod
    vm = relax.VirtualMachine(pipeline.build(mod, target, cfg, start_after="dispatch"), tvm.cpu())

    def run(feeds):
        out = vm["main"](*[tvm.runtime.tensor(feeds[i.name]) for i in imported.inputs])
        return [o.numpy() for o in out]

    return mod, run, cfg, optimized.records


def library_calls(mod) -> int:
    return mod.script(show_meta=False).count(f'R.call_dps_packed("{od.RNN_FUNC}"')


def check(model, feeds, calls=1, reference=False, dispatch="library"):
    mod, run, _, _ = build(model, dispatch)
    assert library_calls(mod) == (calls if dispatch == "library" else 0)
    want = (ReferenceEvaluator(model).run(None, feeds) if reference
            else run_onnxruntime(model, feeds))
    for _ in range(2):  # the second run reuses the cached primitive and reordered weights
        got = run(feeds)
        for g, e in zip(got, want, strict=True):
            np.testing.assert_allclose(g, e, rtol=TOL, atol=TOL)
    return got


@pytest.mark.parametrize("op,kw", [
    ("LSTM", {"direction": "bidirectional"}),
    ("LSTM", {"direction": "reverse", "peepholes": True, "states": False}),
    ("LSTM", {"bias": False}),
    ("GRU", {"direction": "bidirectional", "linear_before_reset": 1}),
    ("GRU", {"direction": "reverse", "linear_before_reset": 0, "states": False}),
    ("GRU", {"direction": "bidirectional", "activations": ["Sigmoid", "Tanh"] * 2}),
    ("RNN", {"direction": "bidirectional"}),
    ("RNN", {"activations": ["Relu"]}),
    ("RNN", {"direction": "reverse", "activations": ["Sigmoid"], "states": False}),
])
def test_whole_node_on_onednn_matches_onnxruntime(op, kw):
    check(*case(op, **kw))


@pytest.mark.parametrize("op,kw", [
    ("LSTM", {"direction": "bidirectional", "peepholes": True}),
    ("GRU", {"direction": "forward", "linear_before_reset": 1, "states": False}),
])
def test_batch_major_layout(op, kw):
    # onnxruntime refuses layout=1; onnx.reference implements it.
    check(*case(op, layout=1, **kw), reference=True)


_LENS_CASES = [
    ("LSTM", "bidirectional", [5, 2, 5]),  # two length groups
    ("LSTM", "reverse", [3, 1, 4]),  # each sequence reversed from its own end
    ("GRU", "bidirectional", [4, 0, 2]),  # a sequence of no steps keeps its initial state
    ("RNN", "forward", [5, 5, 5]),  # every length full: one call
    # packed: a span per distinct length, unsorted lengths, a sequence of no steps
    ("LSTM", "bidirectional", [4, 1, 5, 3, 5, 0]),
    ("GRU", "reverse", [2, 5, 3, 4]),
]


# The bidirectional LSTM's loop kernels take the longest to build: those two run in the slow
# tier; the other codegen cases keep the masking in the default one.
@pytest.mark.parametrize("op,direction,lens,dispatch", [
    pytest.param(*case, dispatch, marks=[pytest.mark.slow] if dispatch == "codegen" and
                 case[:2] == ("LSTM", "bidirectional") else [])
    for case in _LENS_CASES for dispatch in ("library", "codegen")])
def test_sequence_lens(op, direction, lens, dispatch):
    """The library runs unequal lengths packed (a call per span between distinct lengths over
    the sequences still running); the unrolled body masks: both as onnxruntime."""
    extra = {"linear_before_reset": 1} if op == "GRU" else {}
    got = check(*case(op, direction, lens=lens, seed=3, batch=len(lens), **extra),
                dispatch=dispatch)
    for b, n in enumerate(lens):
        assert not got[0][n:, :, b].any()  # rows past each sequence's end are zero


def test_sequence_lens_out_of_range_is_an_error():
    model, feeds = case("GRU", lens=[5, 6, 1])
    _, run, _, _ = build(model)
    with pytest.raises(Exception, match=r"sequence_lens\[1\] = 6 is outside \[0, 5\]"):
        run(feeds)


@pytest.mark.parametrize("kw", [{"clip": 0.5}, {"activations": ["HardSigmoid", "Tanh"]},
                                {"activations": ["Sigmoid", "Tanh", "Tanh", "Tanh"],
                                 "direction": "bidirectional"}])
def test_what_onednn_cannot_run_stays_unrolled(kw):
    op = "GRU"
    model, feeds = case(op, **kw)
    mod, run, _, _ = build(model)
    assert library_calls(mod) == 0
    from tvmopt.passes.recurrent import recurrent_functions

    assert not recurrent_functions(mod)  # inlined back into plain ops
    for g, e in zip(run(feeds), run_onnxruntime(model, feeds), strict=True):
        np.testing.assert_allclose(g, e, rtol=TOL, atol=TOL)


def test_unsupported_reasons():
    from tvmopt.passes.recurrent import recurrent_functions, spec_of
    from tvmopt.frontend.importer import import_onnx

    for kw, why in [({"clip": 1.0}, "clip"), ({"input_forget": 1}, "input_forget"),
                    ({"activations": ["Sigmoid", "Relu", "Tanh"]}, "activations")]:
        mod = import_onnx(case("LSTM", **kw)[0]).mod
        ok, reasons = od.recurrent_sites(mod)
        assert not ok and why in next(iter(reasons.values()))
        assert spec_of(next(iter(recurrent_functions(mod).values())))["op"] == "LSTM"


def test_codegen_dispatch_runs_the_loop_kernels():
    """Codegen: one loop kernel for both directions (the time loop inside the kernel), not the
    unrolled body's kernels per step; the body is inlined back into plain ops around it."""
    from tvm import tirx

    from tvmopt import pipeline
    from tvmopt.passes.recurrent import recurrent_functions
    from tvmopt.runtime.in_memory import host_target

    model, feeds = case("LSTM", "bidirectional")
    mod, run, cfg, _ = build(model, dispatch="codegen")
    assert library_calls(mod) == 0
    fused = pipeline.optimize(mod, host_target().to_tvm(), cfg, start_after="dispatch",
                              until="fastmath").mod
    assert not recurrent_functions(fused)
    loops = [gv.name_hint for gv, f in fused.functions.items()
             if isinstance(f, tirx.PrimFunc) and "lstm_loop" in gv.name_hint]
    assert len(loops) == 1, loops
    for g, e in zip(run(feeds), run_onnxruntime(model, feeds), strict=True):
        np.testing.assert_allclose(g, e, rtol=TOL, atol=TOL)


def test_pinned_choices_skip_timing():
    """--require-db: the library calls the database was tuned with, nothing timed (a node
    the pinned set does not name runs as codegen)."""
    from tvmopt.precision.choice import choose_recurrent
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    mod = import_onnx(case("GRU", "forward")[0]).mod
    (spec, args), = od.recurrent_sites(mod)[0].values()
    key = od.recurrent_workload_key(spec, args)

    def no_build(_m):
        raise AssertionError("a pinned choice builds nothing to time")

    for pinned, side in (({key: "fp32"}, "library"), ({}, "codegen")):
        keep, choices = choose_recurrent(mod, host_target().to_tvm(), no_build, "ext",
                                         pinned=pinned)
        assert [c.choice for c in choices] == [side] and len(keep) == (side == "library")
        assert "database" in choices[0].reason


def test_auto_dispatch_times_both_sides(tmp_path, monkeypatch):
    """auto: each node is timed as the library call and as its loop kernels, the faster kept,
    the choice recorded with the conv2d/matmul ones and cached for the next compile."""
    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path))
    model, feeds = case("GRU", "bidirectional", steps=3, linear_before_reset=1)
    mod, run, _, records = build(model, dispatch="auto")
    rnn = [c for c in records.choices if c.kernel.startswith("rnn|GRU")]
    assert len(rnn) == 1 and rnn[0].library_ms > 0 and rnn[0].codegen_ms > 0
    assert library_calls(mod) == (rnn[0].choice == "library")
    for g, e in zip(run(feeds), run_onnxruntime(model, feeds), strict=True):
        np.testing.assert_allclose(g, e, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("apart", ["0", "1"])
def test_bidirectional_directions_together_or_apart(apart, monkeypatch):
    """A bidirectional node runs as one primitive, or (two threads or more) as its two
    directions at once on a thread each: the same results either way."""
    monkeypatch.setenv("TVMOPT_RNN_SPLIT_DIRECTIONS", apart)
    check(*case("LSTM", "bidirectional", peepholes=True, seed=11))


@pytest.mark.parametrize("op,kw", [
    ("LSTM", {"direction": "bidirectional", "lens": True}),
    ("GRU", {"direction": "reverse", "linear_before_reset": 1, "layout": 1}),
])
def test_symbolic_sequence_length_on_the_library(op, kw):
    """A run-time sequence length: auto dispatch gives the node to the library (its primitive
    takes the time dim at execution; there is no one length to time both sides at), and the
    one build runs at several lengths and batch sizes."""
    layout = kw.get("layout", 0)
    lens = kw.pop("lens", False)
    model, _ = case(op, lens=[5, 2, 5] if lens else None, **kw)
    for inp in model.graph.input:
        dims = inp.type.tensor_type.shape.dim
        if inp.name == "X":
            dims[1 if layout else 0].dim_param = "seq"
            dims[0 if layout else 1].dim_param = "batch"
        elif inp.name == "sequence_lens":
            dims[0].dim_param = "batch"
        elif inp.name.startswith("initial_"):
            dims[0 if layout else 1].dim_param = "batch"
    mod, run, _, records = build(model, dispatch="auto")
    assert library_calls(mod) == 1
    choice = next(c for c in records.choices if c.kernel.startswith(f"rnn|{op}"))
    assert choice.choice == "library" and choice.reason == "run-time sequence length"
    for steps, batch in [(9, 2), (1, 1), (40, 3)]:
        _, feeds = case(op, steps=steps, batch=batch, seed=steps,
                        lens=[steps, 0, steps // 2][:batch] if lens else None, **kw)
        want = (ReferenceEvaluator(model).run(None, feeds) if layout
                else run_onnxruntime(model, feeds))
        for g, e in zip(run(feeds), want, strict=True):
            np.testing.assert_allclose(g, e, rtol=TOL, atol=TOL)


def test_an_untrusted_timing_keeps_the_node_on_the_library(tmp_path, monkeypatch):
    """The unrolled body timed faster only on a loaded machine: the node stays one library
    call (the loop's many small kernels per step are what load slows most), and the choice
    says why; both sides were timed in alternating rounds."""
    from tvmopt.precision import choice
    from tvmopt import timing

    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path))
    order = []

    def loaded(vm, name, inputs, roof=None):
        order.append(vm)
        return timing.Measurement(3.0 if len(order) % 2 else 1.0, 3.0, 1.5)

    monkeypatch.setattr(choice, "measure_call", loaded)
    model, feeds = case("GRU", "bidirectional", steps=3, linear_before_reset=1)
    mod, run, _, records = build(model, dispatch="auto")
    rnn = [c for c in records.choices if c.kernel.startswith("rnn|GRU")]
    assert len(rnn) == 1 and rnn[0].choice == "library" and not rnn[0].trusted
    assert "not trusted" in rnn[0].reason and library_calls(mod)
    assert len(order) == 2 * choice.SIDE_ROUNDS and order[0] == order[3] != order[1]
    for g, e in zip(run(feeds), run_onnxruntime(model, feeds), strict=True):
        np.testing.assert_allclose(g, e, rtol=TOL, atol=TOL)
