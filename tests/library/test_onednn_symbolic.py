"""oneDNN calls on symbolic shapes (dynamic batch / sequence exports) and on matmuls of two
activations (attention): one packed call per chain, outputs equal onnxruntime's at several
values of each symbolic dim, in fp32 and with bf16 compute where the host has bf16 units; and
the dims a symbolic kernel is timed at."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvmopt.library import onednn as od

DIMS = [(1, 1), (1, 37), (3, 64), (2, 130)]  # (batch, seq) values each artifact is run at


@pytest.fixture(scope="module", autouse=True)
def extension(onednn_extension):
    return onednn_extension


def model(nodes, inputs, inits):
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def build_and_check(m, feeds_at, compute="fp32", tol=1e-4):
    """Library dispatch in `compute`; returns {packed func: count}. Runs at every DIMS value."""
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    target = host_target().to_tvm()
    cfg = pipeline.PipelineConfig(dispatch="library", library_compute=(compute,))
    mod = pipeline.optimize(import_onnx(m).mod, target, cfg, until="dispatch").mod
    text = mod.script(show_meta=False)
    calls = {f: text.count(f'R.call_dps_packed("{f}"')
             for f in (od.MATMUL_FUNC, od.BMM_FUNC, od.ATTN_FUNC)}
    vm = relax.VirtualMachine(pipeline.build(mod, target, cfg=cfg, start_after="dispatch"),
                              tvm.cpu())
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, s in DIMS:
        feeds = feeds_at(b, s)
        ref = sess.run(None, feeds)[0]
        for _ in range(2):  # the second run reuses the primitive made for this shape
            out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()]).numpy()
            err = np.abs(out - ref).max() / np.abs(ref).max()
            assert err < tol, f"batch {b}, seq {s}: error {err:.3g} ({compute})"
    return calls


rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def dense_model():
    """x[batch, seq, 48] @ W + B -> GELU: a transformer's dense layer on a dynamic export."""
    inits = {"W": rand(48, 24) * 0.1, "B": rand(24)}
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]),
             helper.make_node("Add", ["m", "B"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    return model(nodes, [("x", ["batch", "seq", 48])], inits)


def attention_model(heads=2, d=16):
    """softmax(q @ k^T / sqrt(d)) @ v on [batch, heads, seq, d] inputs."""
    inits = {"scale": np.array(np.sqrt(d), np.float32)}
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Div", ["s", "scale"], ["sd"]),
             helper.make_node("Softmax", ["sd"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    shape = ["batch", heads, "seq", d]
    return model(nodes, [("q", shape), ("k", shape), ("v", shape)], inits)


def attention_feeds(b, s, heads=2, d=16):
    return {n: rand(b, heads, s, d) for n in ("q", "k", "v")}


def test_dense_layer_on_symbolic_batch_and_sequence_is_one_library_call():
    calls = build_and_check(dense_model(), lambda b, s: {"x": rand(b, s, 48)})
    assert calls == {od.MATMUL_FUNC: 1, od.BMM_FUNC: 0, od.ATTN_FUNC: 0}


def test_attention_is_one_library_call_with_the_transpose_and_scale_folded_in():
    calls = build_and_check(attention_model(), attention_feeds)
    assert calls == {od.MATMUL_FUNC: 0, od.BMM_FUNC: 0, od.ATTN_FUNC: 1}


def test_attention_in_bf16():
    from tvmopt.precision.choice import host_has_bf16

    if not host_has_bf16():
        pytest.skip("this host has no bf16 units (amx_bf16, avx512_bf16)")
    # bf16 keeps 8 significant bits: errors of a few 1e-3 of the output's range.
    calls = build_and_check(attention_model(), attention_feeds, compute="bf16", tol=2e-2)
    assert calls == {od.MATMUL_FUNC: 0, od.BMM_FUNC: 0, od.ATTN_FUNC: 1}


def test_the_scale_of_scores_from_an_already_transposed_key_is_folded_in():
    """q @ kt / sqrt(d) where kt arrives transposed (an exporter that transposes k with the
    head split): the scale is the call's post-op, not a kernel over the scores."""
    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    inits = {"scale": np.array(8.0, np.float32)}
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Div", ["s", "scale"], ["y"])]
    m = model(nodes, [("q", ["batch", 2, "seq", 16]), ("kt", ["batch", 2, 16, "seq"])], inits)
    calls = build_and_check(m, lambda b, s: {"q": rand(b, 2, s, 16), "kt": rand(b, 2, 16, s)})
    assert calls == {od.MATMUL_FUNC: 0, od.BMM_FUNC: 1, od.ATTN_FUNC: 0}
    cfg = pipeline.PipelineConfig(dispatch="library")
    mod = pipeline.optimize(import_onnx(m).mod, host_target().to_tvm(), cfg, until="dispatch").mod
    assert "R.divide" not in mod.script(show_meta=False)


def test_matmul_broadcasting_a_batch_dim_of_one():
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    m = model(nodes, [("a", [2, 3, "seq", 8]), ("b", [1, 3, 8, 5])], {})
    calls = build_and_check(m, lambda b, s: {"a": rand(2, 3, s, 8), "b": rand(1, 3, 8, 5)})
    assert calls == {od.MATMUL_FUNC: 0, od.BMM_FUNC: 1, od.ATTN_FUNC: 0}


def test_a_transpose_of_other_axes_is_not_folded_into_the_call():
    # k^T over axes (0, 2, 1, 3) is not a transpose of the last two: it stays a TVM kernel and
    # the matmul reads its result.
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["q", "kt"], ["y"])]
    m = model(nodes, [("q", [1, 4, 3, 8]), ("k", [1, 8, 4, 3])], {})
    calls = build_and_check(m, lambda b, s: {"q": rand(1, 4, 3, 8), "k": rand(1, 8, 4, 3)})
    assert calls == {od.MATMUL_FUNC: 0, od.BMM_FUNC: 1, od.ATTN_FUNC: 0}


def _func_with(*shapes):
    from tvm import relax, tirx

    names = {}

    def dim(d):
        return d if isinstance(d, int) else names.setdefault(d, tirx.Var(d, "int64"))

    params = [relax.Var(f"p{i}", relax.TensorType([dim(d) for d in s], "float32"))
              for i, s in enumerate(shapes)]
    return relax.Function(params, params[0], params[0].ty)


def test_symbolic_dims_are_timed_at_their_bounds_capped_in_product():
    from tvmopt.timing import SYMBOLIC_ROWS, timing_dims

    f = _func_with(["batch", "seq", 64])
    assert timing_dims(f, {"batch": (1, 8), "seq": (1, 32)}) == {"batch": 8, "seq": 32}
    big = timing_dims(f, {"batch": (1, 8), "seq": (1, 4096)})
    assert big["batch"] * big["seq"] <= SYMBOLIC_ROWS and big["batch"] == 8
    # a lower bound is never undercut, even past the cap
    assert timing_dims(f, {"batch": (4, 4), "seq": (600, 4096)}) == {"batch": 4, "seq": 600}
    unbounded = timing_dims(f, {})
    assert unbounded["batch"] * unbounded["seq"] <= SYMBOLIC_ROWS
    assert timing_dims(_func_with([2, 3]), {}) == {}


def test_a_convolution_is_timed_at_a_batch_whose_pixels_fit_the_cap():
    """A convolution's rows are batch x pixels: a 48x48 map is 2304 rows an image, so a
    symbolic batch is timed at its lower bound, not at a batch of SYMBOLIC_ROWS images."""
    from tvmopt.timing import SYMBOLIC_ROWS, timing_dims

    f = _func_with(["batch", 48, 48, 16])
    assert timing_dims(f, {}, image=True) == {"batch": 1}
    assert timing_dims(f, {"batch": (2, 64)}, image=True) == {"batch": 2}
    assert timing_dims(_func_with(["batch", 4, 4, 16]), {}, image=True) == {
        "batch": SYMBOLIC_ROWS // 16}
    assert timing_dims(f, {}) == {"batch": SYMBOLIC_ROWS}  # a dense layer's rows: batch only


def cnn_block_model():
    """conv3x3 + bias + ReLU6 -> depthwise 3x3 + ReLU6 -> 1x1 + the block's input: a
    MobileNet block exported with a dynamic batch (ReLU6 as Clip, which the importer
    spells as TE max/min calls)."""
    lo, hi = np.array(0.0, np.float32), np.array(6.0, np.float32)
    inits = {"W1": rand(16, 16, 3, 3) * 0.2, "B1": rand(16), "W2": rand(16, 1, 3, 3) * 0.3,
             "B2": rand(16), "W3": rand(16, 16, 1, 1) * 0.3, "lo": lo, "hi": hi}
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], kernel_shape=[3, 3],
                              pads=[1] * 4),
             helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
             helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], kernel_shape=[3, 3],
                              pads=[1] * 4, group=16),
             helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
             helper.make_node("Conv", ["r2", "W3"], ["c3"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["c3", "x"], ["y"])]
    return model(nodes, [("x", ["batch", 16, 12, 12])], inits)


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_convolutions_on_a_symbolic_batch_are_library_calls(compute):
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.precision.choice import host_has_bf16
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    if compute == "bf16" and not host_has_bf16():
        pytest.skip("this host has no bf16 units (amx_bf16, avx512_bf16)")
    m = cnn_block_model()
    target = host_target().to_tvm()
    cfg = pipeline.PipelineConfig(dispatch="library", library_compute=(compute,))
    mod = pipeline.optimize(import_onnx(m).mod, target, cfg, until="dispatch").mod
    text = mod.script(show_meta=False)
    assert text.count(f'R.call_dps_packed("{od.CONV_FUNC}"') == 3
    assert "R.call_tir" not in text  # the ReLU6s went into the calls as post-ops
    vm = relax.VirtualMachine(pipeline.build(mod, target, cfg=cfg, start_after="dispatch"),
                              tvm.cpu())
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    tol = 2e-2 if compute == "bf16" else 1e-4
    for batch in (1, 3, 1):
        x = rand(batch, 16, 12, 12)
        ref = sess.run(None, {"x": x})[0]
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        assert np.abs(got - ref).max() / np.abs(ref).max() < tol, (batch, compute)


def _window_rows_func():
    """A composite as Swin's window partition reaches dispatch under a symbolic batch: its
    dims read back from a run-time shape, four distinct vars all named `x` (TVM names them)."""
    from tvm import relax, tirx

    b, h, w, c = (tirx.Var("x", "int64") for _ in range(4))
    rows = b * tirx.floordiv(h, 4) * tirx.floordiv(w, 4) * c // 24
    dims = relax.Var("dims", relax.ShapeType([b, h, w, c]))
    x = relax.Var("lv", relax.TensorType([rows, 16, 24], "float32"))
    return relax.Function([dims, x], x, x.ty)


def test_distinct_dims_of_one_name_are_timed_apart_and_never_empty():
    from tvmopt.timing import (SYMBOLIC_ROWS, dim_value, distinct_dim_names,
                                       random_inputs, timing_dims)

    f = distinct_dim_names(_window_rows_func())
    names = [v.name for v in f.params[0].ty.values]
    assert len(set(names)) == 4 and names[0] == "x"
    dims = timing_dims(f, {})
    assert sorted(dims) == sorted(names)
    rows = dim_value(f.params[1].ty.shape.values[0], dims)
    assert 1 <= rows <= SYMBOLIC_ROWS
    arrays = random_inputs(f, np.random.default_rng(0), dims)
    assert arrays[1].shape == (rows, 16, 24)
    # a function whose dims already have names of their own is returned as it is
    assert distinct_dim_names(f).same_as(f)


def test_dims_only_passed_as_values_are_capped_together():
    from tvm import relax, tirx

    from tvmopt.timing import SYMBOLIC_ROWS, timing_dims

    m, n = tirx.Var("m", "int64"), tirx.Var("n", "int64")
    dims = relax.Var("dims", relax.ShapeType([m, n]))
    x = relax.Var("x", relax.TensorType([4, 8], "float32"))
    values = timing_dims(relax.Function([dims, x], x, x.ty), {})
    assert sorted(values) == ["m", "n"] and values["m"] * values["n"] <= SYMBOLIC_ROWS


def test_a_shape_with_a_zero_divisor_has_no_value():
    from tvm import tirx

    from tvmopt.timing import dim_value

    n, d = tirx.Var("n", "int64"), tirx.Var("d", "int64")
    expr = n // tirx.floordiv(d, 4)
    with pytest.raises(ValueError, match="does not reduce"):
        dim_value(expr, {"n": 8, "d": 1})
    unknown: set[str] = set()
    assert dim_value(expr, {"n": 8, "d": 1}, unknown) == 1 and unknown


def test_a_run_time_window_partition_is_timed_at_a_size_of_its_own(tmp_path, monkeypatch):
    """Pads computed from Shape (Swin under a symbolic batch) leave the windowed dense layer
    with dims known only at run time; auto dispatch times it at a small size of its own (it
    asked for a 512 GiB input once) and the build matches onnxruntime."""
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt import timing
    from tvmopt.runtime.in_memory import host_target

    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Mul", ["s", "zero"], ["z"]),  # zero pads, known at run time
             helper.make_node("Concat", ["z", "z"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads"], ["p"]),
             helper.make_node("Reshape", ["p", "win"], ["w"]),
             helper.make_node("MatMul", ["w", "wt"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    m = model(nodes, [("x", ["batch", 8, 8, 8])],
              {"zero": np.zeros(4, np.int64), "win": np.array([-1, 16, 8], np.int64),
               "wt": rand(8, 8), "b": rand(8)})
    target = host_target().to_tvm()
    cfg = pipeline.PipelineConfig(dispatch="auto")
    optimized = pipeline.optimize(import_onnx(m).mod, target, cfg, until="dispatch")
    mod, (choice,) = optimized.mod, optimized.records.choices
    timed = dict(kv.split("=") for kv in choice.note.split("timed at ")[1].split(", "))
    assert len(timed) == 4 and all(int(v) >= 1 for v in timed.values())
    assert max(int(v) for v in timed.values()) <= timing.SYMBOLIC_ROWS
    vm = relax.VirtualMachine(pipeline.build(mod, target, cfg=cfg, start_after="dispatch"),
                              tvm.cpu())
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = rng.standard_normal((batch, 8, 8, 8)).astype(np.float32)
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dispatch", ["library", "codegen"])
@pytest.mark.parametrize("stride,pad,dil,group", [(1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1),
                                                  (1, 1, 1, 4)])
def test_conv1d_takes_the_2d_path_and_matches(dispatch, stride, pad, dil, group):
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    inits = {"W": rand(16, 8 // group, 3) * 0.2, "B": rand(16)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[3],
                              strides=[stride], pads=[pad, pad], dilations=[dil], group=group),
             helper.make_node("Relu", ["c"], ["y"])]
    m = model(nodes, [("x", [1, 8, 50])], inits)
    target = host_target().to_tvm()
    cfg = pipeline.PipelineConfig(dispatch=dispatch)
    mod = pipeline.optimize(import_onnx(m).mod, target, cfg, until="dispatch").mod
    text = mod.script(show_meta=False)
    assert "R.nn.conv1d" not in text
    assert text.count(f'R.call_dps_packed("{od.CONV_FUNC}"') == (dispatch == "library")
    vm = relax.VirtualMachine(pipeline.build(mod, target, cfg=cfg, start_after="dispatch"),
                              tvm.cpu())
    x = rand(1, 8, 50)
    ref = ort.InferenceSession(m.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), ref, rtol=1e-4,
                               atol=1e-4)
