"""Default CPU schedules: every kernel class compiled through the pipeline matches onnxruntime,
in the imported layout and in NHWC, and the heavy kernels really get a schedule."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(0)


def _const(name, shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype("float32") * 0.1, name)


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def conv_case(cin, cout, hw, k, stride, pad, groups=1, epi="bias_relu", residual=False):
    w = _const("w", (cout, cin // groups, k, k))
    b = _const("b", (cout,))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k],
                              strides=[stride, stride], pads=[pad] * 4, group=groups)]
    last = "c"
    oh = (hw + 2 * pad - k) // stride + 1
    inputs = [_vi("x", [1, cin, hw, hw])]
    if residual:
        inputs.append(_vi("r", [1, cout, oh, oh]))
        nodes.append(helper.make_node("Add", [last, "r"], ["a"]))
        last = "a"
    if epi == "bias_relu":
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    elif epi == "clip":
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    inits = [w, b]
    if epi == "clip":
        inits += [numpy_helper.from_array(np.array(0.0, "float32"), "lo"),
                  numpy_helper.from_array(np.array(6.0, "float32"), "hi")]
    return _model(nodes, inputs, [_vi("y", [1, cout, oh, oh])], inits)


def matmul_case(m, k, n, epi="bias", batch=None, sym=False):
    w = _const("w", (k, n))
    b = _const("b", (n,))
    lead = (["B", "S"] if sym else [1, m]) if batch is None else [batch, m]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["z"])]
    if epi == "gelu":
        nodes += [helper.make_node("Div", ["z", "sq2"], ["d"]),
                  helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]),
                  helper.make_node("Mul", ["z", "e1"], ["zm"]),
                  helper.make_node("Mul", ["zm", "half"], ["y"])]
        extra = [numpy_helper.from_array(np.array(v, "float32"), nm)
                 for nm, v in (("sq2", 1.4142135), ("one", 1.0), ("half", 0.5))]
    elif epi == "relu":
        nodes.append(helper.make_node("Relu", ["z"], ["y"]))
        extra = []
    else:
        nodes.append(helper.make_node("Identity", ["z"], ["y"]))
        extra = []
    return _model(nodes, [_vi("x", lead + [k])], [_vi("y", lead + [n])], [w, b] + extra)


def batch_matmul_case(b, h, m, k, n, sym=False):
    dims = ["B", h, "S"] if sym else [b, h, m]
    nodes = [helper.make_node("MatMul", ["a", "bt"], ["c"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0.125, "float32"), "s")]
    a = _vi("a", dims + [k])
    bt = _vi("bt", (["B", h] if sym else [b, h]) + [k, "S" if sym else n])
    return _model(nodes, [a, bt], [_vi("y", dims + ["S" if sym else n])], inits)


def pool_case(kind, c, hw):
    if kind == "max":
        node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                pads=[1, 1, 1, 1])
        oh = (hw + 2 - 3) // 2 + 1
        out = [1, c, oh, oh]
    elif kind == "avg":
        node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
        out = [1, c, hw // 2, hw // 2]
    else:
        node = helper.make_node("GlobalAveragePool", ["x"], ["y"])
        out = [1, c, 1, 1]
    return _model([node], [_vi("x", [1, c, hw, hw])], [_vi("y", out)], [])


def eltwise_case():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Sigmoid", ["t"], ["s"]),
             helper.make_node("Mul", ["t", "s"], ["y"])]
    return _model(nodes, [_vi("x", [2, 12, 33, 40])], [_vi("y", [2, 33, 12, 40])], [])


def cnn_block_case():
    """conv -> relu -> maxpool -> depthwise -> pointwise + residual -> global pool -> fc."""
    inits = [_const("w1", (16, 3, 3, 3)), _const("b1", (16,)), _const("w2", (16, 1, 3, 3)),
             _const("w3", (16, 16, 1, 1)), _const("fw", (16, 10)), _const("fb", (10,))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1] * 4,
                         group=16),
        helper.make_node("Conv", ["c2", "w3"], ["c3"], kernel_shape=[1, 1]),
        helper.make_node("Add", ["c3", "p1"], ["a"]),
        helper.make_node("GlobalAveragePool", ["a"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"]),
    ]
    return _model(nodes, [_vi("x", [1, 3, 32, 32])], [_vi("y", [1, 10])], inits)


def squeeze_excite_case(c=48, r=12, hw=28):
    """EfficientNet's squeeze-excite between two convs: pool -> 1x1 conv -> SiLU -> 1x1 conv ->
    sigmoid, which scales the whole feature map: that conv's epilogue writes hw*hw times its
    output."""
    inits = [_const("w0", (c, c, 1, 1)), _const("w1", (r, c, 1, 1)), _const("b1", (r,)),
             _const("w2", (c, r, 1, 1)), _const("b2", (c,)), _const("w3", (c, c, 1, 1))]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["f"], kernel_shape=[1, 1]),
        helper.make_node("GlobalAveragePool", ["f"], ["g"]),
        helper.make_node("Conv", ["g", "w1", "b1"], ["c1"], kernel_shape=[1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s1"]),
        helper.make_node("Mul", ["c1", "s1"], ["a1"]),
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], kernel_shape=[1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["s2"]),
        helper.make_node("Mul", ["f", "s2"], ["m"]),
        helper.make_node("Conv", ["m", "w3"], ["y"], kernel_shape=[1, 1]),
    ]
    return _model(nodes, [_vi("x", [1, c, hw, hw])], [_vi("y", [1, c, hw, hw])], inits)


def row_reduction_case(kind, shape, sym=False):
    """Softmax / LayerNormalization / an RMS norm / ReduceMean over the last axis."""
    n = shape[-1]
    dims = ["batch", "seq", n] if sym else list(shape)
    inits, nodes = [], []
    if kind == "softmax":
        nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)]
    elif kind == "layernorm":
        inits = [_const("g", (n,)), _const("b", (n,))]
        nodes = [helper.make_node("Add", ["x", "x"], ["x2"]),  # a fused producer, as in models
                 helper.make_node("LayerNormalization", ["x2", "g", "b"], ["y"], axis=-1)]
    elif kind == "rmsnorm":
        inits = [_const("g", (n,)), numpy_helper.from_array(np.array(1e-6, np.float32), "eps")]
        nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]),
                 helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
                 helper.make_node("Add", ["ms", "eps"], ["mse"]),
                 helper.make_node("Sqrt", ["mse"], ["rms"]),
                 helper.make_node("Div", ["x", "rms"], ["xn"]),
                 helper.make_node("Mul", ["xn", "g"], ["y"])]
    return _model(nodes, [_vi("x", dims)], [_vi("y", dims)], inits)



def softmax_symbolic_row_case():
    return _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [_vi("x", ["b", "n"])],
                  [_vi("y", ["b", "n"])], [])


CASES = {
    "conv3x3": lambda: conv_case(32, 64, 28, 3, 1, 1),
    "conv3x3_cin3_s2": lambda: conv_case(3, 32, 56, 3, 2, 1),
    "conv7x7_s2": lambda: conv_case(3, 64, 64, 7, 2, 3),
    "conv1x1": lambda: conv_case(64, 128, 14, 1, 1, 0, epi="none"),
    "conv1x1_s2": lambda: conv_case(64, 128, 14, 1, 2, 0),
    "conv3x3_residual": lambda: conv_case(64, 64, 14, 3, 1, 1, residual=True),
    "conv_grouped": lambda: conv_case(64, 64, 14, 3, 1, 1, groups=4),
    "conv_depthwise_clip": lambda: conv_case(96, 96, 28, 3, 1, 1, groups=96, epi="clip"),
    "conv_depthwise_s2": lambda: conv_case(32, 32, 28, 3, 2, 1, groups=32, epi="clip"),
    "conv_odd_channels": lambda: conv_case(5, 12, 9, 3, 1, 1),
    "dense_bias": lambda: matmul_case(64, 256, 768),
    "dense_gelu": lambda: matmul_case(128, 256, 1024, epi="gelu"),
    "dense_relu_ragged": lambda: matmul_case(30, 50, 70, epi="relu"),
    "dense_m1": lambda: matmul_case(1, 512, 1000),
    "dense_197_tokens": lambda: matmul_case(197, 384, 384, epi="gelu"),
    "dense_sym_batch_seq": lambda: matmul_case(0, 64, 96, epi="gelu", sym=True),
    "batch_matmul": lambda: batch_matmul_case(1, 4, 128, 64, 128),
    "batch_matmul_sym": lambda: batch_matmul_case(0, 4, 0, 32, 0, sym=True),
    "batch_matmul_197_tokens": lambda: batch_matmul_case(1, 6, 197, 64, 197),
    "maxpool": lambda: pool_case("max", 32, 28),
    "avgpool": lambda: pool_case("avg", 16, 16),
    "global_avgpool": lambda: pool_case("global", 64, 7),
    "eltwise": eltwise_case,
    "softmax_rows": lambda: row_reduction_case("softmax", (1, 4, 128, 128)),
    "softmax_ragged_rows": lambda: row_reduction_case("softmax", (2, 3, 50)),
    "layernorm_rows": lambda: row_reduction_case("layernorm", (1, 128, 256)),
    "rmsnorm_rows": lambda: row_reduction_case("rmsnorm", (1, 17, 320)),
    "layernorm_sym_rows": lambda: row_reduction_case("layernorm", (0, 0, 64), sym=True),
    "softmax_sym_row_length": softmax_symbolic_row_case,
    "cnn_block": cnn_block_case,
    "squeeze_excite": squeeze_excite_case,
}

SYM_SHAPES = {"dense_sym_batch_seq": {"x": (2, 37, 64)},
              "layernorm_sym_rows": {"x": (2, 9, 64)},
              # a row of 2 vectors and 1 element: a predicated partial sum would read past it
              "softmax_sym_row_length": {"x": (3, 33)},
              "batch_matmul_sym": {"a": (2, 4, 19, 32), "bt": (2, 4, 32, 19)}}


def _inputs(name, model):
    feeds = {}
    for vi in model.graph.input:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        shape = SYM_SHAPES.get(name, {}).get(vi.name, tuple(dims))
        feeds[vi.name] = RNG.standard_normal(shape).astype("float32")
    return feeds




def _run(model, feeds, cfg):
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    target = host_target().to_tvm()
    mod = import_onnx(model).mod
    scheduled = pipeline.optimize(mod, target, cfg).mod
    ex = pipeline.build(mod, target, cfg)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()])
    out = out if hasattr(out, "numpy") else out[0]
    return out.numpy(), scheduled


def _unscheduled_contractions(mod):
    """PrimFuncs with a reduction that no rule scheduled (left as LLVM's naive loop nest)."""
    import tvm

    left = []
    for gv, f in mod.functions_items():
        if isinstance(f, tvm.tirx.PrimFunc) and not (f.attrs and "tirx.is_scheduled" in f.attrs):
            if re.search(r'T\.axis\.(remap\("[SR]*R|reduce)', f.script()):
                left.append(gv.name_hint)
    return left


@pytest.mark.parametrize("layout", ["imported", "nhwc"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_class_matches_onnxruntime(name, layout):
    from tvmopt import pipeline

    model = CASES[name]()
    feeds = _inputs(name, model)
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    cfg = pipeline.PipelineConfig(dispatch="codegen", channels_last=(layout == "nhwc"))
    got, scheduled = _run(model, feeds, cfg)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert not _unscheduled_contractions(scheduled), "a contraction kept the naive loop nest"


def deep_reuse_case(depth=8):
    """y <- -(y*y + y), repeated: every step reads the previous one three times."""
    nodes, last = [], "x"
    for i in range(depth):
        nodes += [helper.make_node("Mul", [last, last], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", last], [f"a{i}"]),
                  helper.make_node("Neg", [f"a{i}"], [f"t{i}"])]
        last = f"t{i}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    return _model(nodes, [_vi("x", [4, 64])], [_vi("y", [4, 64])], [])


def test_elementwise_kernels_are_scheduled():
    from tvmopt import pipeline

    model = eltwise_case()
    feeds = _inputs("eltwise", model)
    _, scheduled = _run(model, feeds, pipeline.PipelineConfig(dispatch="codegen"))
    import tvm

    funcs = [f for _, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert funcs and all(f.attrs and "tirx.is_scheduled" in f.attrs for f in funcs)
    assert any("T.parallel" in f.script() for f in funcs)


def test_inlining_repeated_reads_stays_linear():
    """Inlining a producer at each of its loads, level after level, would grow the kernel as
    3^depth; the elementwise rule keeps it linear and the result exact."""
    import tvm

    from tvmopt import pipeline

    model = deep_reuse_case()
    feeds = {"x": RNG.uniform(-0.5, 0.5, (4, 64)).astype("float32")}
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got, scheduled = _run(model, feeds, pipeline.PipelineConfig(dispatch="codegen"))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    sizes = [len(f.script()) for _, f in scheduled.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc)]
    assert max(sizes) < 100_000, sizes


def test_depthwise_conv_reads_its_padding_in_place():
    """Without a row axis the conv is one sweep over its input; a padded copy would double it."""
    import tvm

    from tvmopt import pipeline

    model = CASES["conv_depthwise_s2"]()
    _, scheduled = _run(model, _inputs("conv_depthwise_s2", model),
                        pipeline.PipelineConfig(dispatch="codegen", channels_last=True))
    convs = [f.script() for _, f in scheduled.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in f.script()]
    assert convs and all("pad_temp" not in s and "PaddedInput" not in s for s in convs)
    assert all("T.if_then_else" in s for s in convs)


def test_only_constant_operands_are_repacked_and_an_activation_is_read_in_place():
    """The contraction rule re-lays a weight out in blocks, a copy that folds into the
    constant. A global average pool in NHWC looks like the same contraction (its activation
    indexed by the reduction and the channel only); repacked, its copy ran on every call."""
    import tvm

    from tvmopt import pipeline

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["y"])]
    model = _model(nodes, [_vi("x", [1, 64, 12, 12])], [_vi("y", [1, 128, 1, 1])],
                   [_const("w", (128, 64, 1, 1))])
    feeds = {"x": RNG.standard_normal((1, 64, 12, 12)).astype("float32")}
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got, scheduled = _run(model, feeds,
                          pipeline.PipelineConfig(dispatch="codegen", channels_last=True))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    names = [gv.name_hint for gv, f in scheduled.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc)]
    assert any(n.endswith("_prepacked") and "conv2d" in n for n in names), names
    assert not any(n.endswith("_weight_prepack") for n in names), names


@pytest.mark.parametrize("op,keepdims", [("ReduceMin", 0), ("ReduceMax", 1), ("ReduceSum", 0)])
def test_a_whole_tensor_reduction_runs_in_vector_partials_on_the_threads(op, keepdims):
    """The min and max a dynamic quantization takes of an activation: one scalar chain
    before (a millisecond for a 112x112x96 map); now chunks of vector partials in parallel."""
    import tvm

    from tvmopt import pipeline

    shape = (1, 32, 24, 24)
    node = helper.make_node(op, ["x"], ["y"], keepdims=keepdims)
    model = _model([node], [_vi("x", list(shape))],
                   [_vi("y", [1, 1, 1, 1] if keepdims else [])], [])
    x = RNG.standard_normal(shape).astype("float32")
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got, scheduled = _run(model, {"x": x}, pipeline.PipelineConfig(dispatch="codegen"))
    tol = 1e-5 if op == "ReduceSum" else 0  # a min or max is exact in any order
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=tol, atol=tol)
    text = "".join(f.script() for _, f in scheduled.functions_items()
                   if isinstance(f, tvm.tirx.PrimFunc))
    assert "_rf" in text and "T.parallel" in text and "T.vectorized" in text, text


def test_an_epilogue_larger_than_its_contraction_is_not_unrolled_at_the_tile():
    """Squeeze-excite's scaling unrolled under a 1x1 conv's tile was 56*56*4 copies of a sigmoid
    (EfficientNet-B0: LLVM ran for minutes); it runs as its own elementwise pass."""
    import tvm

    from tvmopt import pipeline

    model = squeeze_excite_case(c=32, r=8, hw=80)
    _, scheduled = _run(model, _inputs("squeeze_excite", model),
                        pipeline.PipelineConfig(dispatch="codegen", channels_last=True))
    unrolled = [int(n) for _, f in scheduled.functions_items()
                if isinstance(f, tvm.tirx.PrimFunc)
                for n in re.findall(r"T\.unroll\(T\.int64\((\d+)\)\)", f.script())]
    assert unrolled and max(unrolled) <= 64


def test_a_ragged_token_count_is_padded_to_whole_vectors_and_rows():
    """197 tokens (ViT) has no divisor to tile by: attention scores ran one scalar FMA at a time.
    The contraction is padded (200 rows: a multiple of the 8-row tile) and vectorized."""
    import tvm

    from tvmopt import pipeline

    model = CASES["batch_matmul_197_tokens"]()
    _, scheduled = _run(model, _inputs("batch_matmul_197_tokens", model),
                        pipeline.PipelineConfig(dispatch="codegen"))
    mms = [f.script() for gv, f in scheduled.functions_items()
           if isinstance(f, tvm.tirx.PrimFunc) and "matmul" in gv.name_hint]
    assert mms and all("T.int64(200)" in s and "T.vectorized" in s for s in mms)


@pytest.mark.parametrize("regs,nvec,rows,expect", [
    (32, 4, [7, 1], (2, 7)),      # AVX-512, 64 channels, 7/14-wide rows: 7x4 would not fit
    (32, 4, [8, 4, 2, 1], (4, 4)),
    (16, 4, [7, 1], (1, 7)),      # AVX2
    (16, 4, [8, 4, 2, 1], (4, 2)),
    (32, 1, [1], (1, 1)),         # depthwise / pooling: no row axis
])
def test_register_tile_leaves_room_for_the_weights_and_the_broadcast(regs, nvec, rows, expect):
    from tvmopt.codegen.cpu import register_tile

    nv, rt = register_tile(nvec, rows, regs)
    assert (nv, rt) == expect
    assert rt * nv + nv + 1 <= regs  # accumulators + weight vectors + broadcast


@pytest.mark.parametrize("rows,padded", [(128, False), (196, False), (197, True), (22, True)])
def test_only_rows_without_a_tile_divisor_are_padded(rows, padded):
    """Padding costs a copy of each operand: rows with a divisor from 4 to 8 tile as they are,
    on AVX2's 16 registers too, where the chosen tile may have fewer rows than that divisor."""
    from tvm import te
    from tvm.target import Target

    from tvmopt.codegen.cpu import CPUParams, MatmulRule

    a = te.placeholder((rows, 256), name="a")
    b = te.placeholder((256, 512), name="b")
    k = te.reduce_axis((0, 256), name="k")
    c = te.compute((rows, 512), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    func = te.create_prim_func([a, b, c])
    sch = MatmulRule(CPUParams(256, 16)).apply(func, Target({"kind": "llvm"}), False)
    assert sch is not None
    text = sch.mod["main"].script()
    assert ("_pad" in text) == padded, text[:2000]
    assert "T.vectorized" in text


@pytest.mark.parametrize("kind", ["softmax", "layernorm", "rmsnorm"])
def test_row_reductions_accumulate_a_vector_of_partial_sums(kind):
    """A norm's or softmax's row sum runs as `lanes` partial sums in one vector register
    (rfactor), not one scalar add after another."""
    import tvm

    from tvmopt import pipeline

    model = row_reduction_case(kind, (1, 64, 256))
    _, scheduled = _run(model, _inputs(kind, model), pipeline.PipelineConfig(dispatch="codegen"))
    rows = [f.script() for f in scheduled.functions.values()
            if isinstance(f, tvm.tirx.PrimFunc) and "T.axis.reduce" in f.script()]
    assert rows and all("_rf" in t and "T.vectorized" in t for t in rows), rows


def test_a_ragged_softmax_row_is_padded_to_whole_vectors_and_stays_exact():
    """A softmax over 197 tokens (ViT's row, not a whole number of vectors) still sums in
    vector partials (its row is padded with -inf inside the kernel), and matches the exact
    softmax, including masked (-inf) entries, a fully masked row (NaN, as onnxruntime gives)
    and large magnitudes."""
    import tvm

    from tvmopt import pipeline

    model = row_reduction_case("softmax", (2, 5, 197))
    x = (RNG.standard_normal((2, 5, 197)) * 30).astype("float32")
    x[0, 0, :] = -np.inf
    x[0, 1, 5:] = -np.inf
    x[1, 2, :] = np.finfo(np.float32).min
    got, scheduled = _run(model, {"x": x}, pipeline.PipelineConfig(dispatch="codegen"))
    rows = [f.script() for f in scheduled.functions.values()
            if isinstance(f, tvm.tirx.PrimFunc) and "T.axis.reduce" in f.script()]
    assert rows and all("_rf" in t and "T.vectorized" in t for t in rows), rows
    e = np.exp(x - x.max(-1, keepdims=True))
    with np.errstate(invalid="ignore"):
        ref = e / e.sum(-1, keepdims=True)
    assert (np.isnan(got) == np.isnan(ref)).all()
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(got[ok], ref[ok], rtol=1e-5, atol=1e-6)


def test_a_symbolic_softmax_row_sums_in_vector_partials_at_every_length():
    """A softmax over a dynamic sequence length (a symbolic row) is padded to whole vectors
    inside its kernel, so it too sums in vector partials; one build is exact at lengths that
    are whole vectors, ragged, and shorter than one vector."""
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    target = host_target().to_tvm()
    cfg = pipeline.PipelineConfig(dispatch="codegen")
    mod = import_onnx(softmax_symbolic_row_case()).mod
    scheduled = pipeline.optimize(mod, target, cfg).mod
    rows = [f.script() for f in scheduled.functions.values()
            if isinstance(f, tvm.tirx.PrimFunc) and "T.axis.reduce" in f.script()]
    assert rows and all("_rf" in t and "T.vectorized" in t for t in rows), rows
    vm = relax.VirtualMachine(pipeline.build(mod, target, cfg), tvm.cpu())
    for n in (1, 7, 16, 33, 64, 197):
        x = (RNG.standard_normal((3, n)) * 20).astype("float32")
        x[0, n // 2:] = -np.inf
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        e = np.exp(x - x.max(-1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6,
                                   err_msg=f"row length {n}")


def test_an_elementwise_kernel_over_a_symbolic_row_keeps_its_inner_loop():
    """Scaling attention scores of a symbolic sequence length: the outer axes run in parallel
    and the innermost stays its own loop, instead of one flat loop that recomputes every index
    with a division and a modulo per element."""
    import tvm

    from tvmopt import pipeline

    inits = [numpy_helper.from_array(np.array(8.0, np.float32), "c")]
    model = _model([helper.make_node("Div", ["x", "c"], ["y"])],
                   [_vi("x", ["b", 4, "n", "n"])], [_vi("y", ["b", 4, "n", "n"])], inits)
    x = RNG.standard_normal((2, 4, 37, 37)).astype("float32")
    got, scheduled = _run(model, {"x": x}, pipeline.PipelineConfig(dispatch="codegen"))
    np.testing.assert_allclose(got, x / 8, rtol=1e-6)
    text = [f.script() for f in scheduled.functions.values()
            if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(text) == 1
    inner = [ln for ln in text[0].splitlines() if "T.axis.spatial(n," in ln][-1]
    assert "%" not in inner and "//" not in inner, text[0]


def test_a_transpose_to_a_short_innermost_axis_reads_rows_not_gathers():
    """NCHW -> NHWC of a 3-channel image (every CNN's input under the NHWC layout): the rows
    run in parallel, the 3 channels are unrolled inside the loop over a row's pixels (which
    LLVM vectorizes on the input's unit stride), instead of one flat vector loop that gathers
    each lane at an index computed with a division and a modulo."""
    import tvm

    from tvmopt import pipeline

    model = _model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])],
                   [_vi("x", [1, 3, 40, 24])], [_vi("y", [1, 40, 24, 3])], [])
    x = RNG.standard_normal((1, 3, 40, 24)).astype("float32")
    got, scheduled = _run(model, {"x": x}, pipeline.PipelineConfig(dispatch="codegen"))
    np.testing.assert_array_equal(got, x.transpose(0, 2, 3, 1))
    text = [f.script() for f in scheduled.functions.values()
            if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(text) == 1
    assert "T.parallel(T.int64(40))" in text[0] and "T.unroll(T.int64(3))" in text[0], text[0]
    assert "T.vectorized" not in text[0] and "//" not in text[0], text[0]


@pytest.mark.parametrize("n, parallel", [(64, False), (1024, False), (8192, True)])
def test_only_an_elementwise_kernel_worth_two_threads_runs_in_parallel(n, parallel):
    """Waking the thread pool costs more than a whole small loop (a mask, a classifier's
    bias): up to SERIAL_ELEMENTS elements the kernel stays on one thread, vectorized."""
    import tvm

    from tvmopt import pipeline
    from tvmopt.codegen.cpu import SERIAL_ELEMENTS

    assert (n > SERIAL_ELEMENTS) == parallel
    model = _model([helper.make_node("Add", ["x", "y"], ["a"]),
                    helper.make_node("Tanh", ["a"], ["z"])],
                   [_vi("x", [1, n]), _vi("y", [1, n])], [_vi("z", [1, n])], [])
    x, y = (RNG.standard_normal((1, n)).astype("float32") for _ in range(2))
    got, scheduled = _run(model, {"x": x, "y": y}, pipeline.PipelineConfig(dispatch="codegen"))
    np.testing.assert_allclose(got, np.tanh(x + y), rtol=1e-5, atol=1e-6)
    text = [f.script() for f in scheduled.functions.values()
            if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(text) == 1
    assert ("T.parallel" in text[0]) == parallel and "T.vectorized" in text[0], text[0]


def test_weights_are_packed_once_beside_a_loop_kernel():
    """A recurrent layer's loop kernel is written scheduled, with no root block, which TVM's
    SplitLayoutRewritePreproc asserts on: every other kernel of such a module used to re-pack
    its weight on every call. The packing still folds into the constants."""
    import tvm

    from tvmopt import pipeline

    hidden, size = 8, 4
    nodes = [helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=hidden),
             helper.make_node("Reshape", ["y", "shape"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["out"])]
    shape = numpy_helper.from_array(np.asarray([6, hidden], np.int64), "shape")
    model = _model(nodes, [_vi("x", [6, 1, size])], [_vi("out", [6, 128])],
                   [_const("W", (1, 4 * hidden, size)), _const("R", (1, 4 * hidden, hidden)),
                    shape, _const("w", (hidden, 128))])
    feeds = {"x": RNG.standard_normal((6, 1, size)).astype("float32")}
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got, scheduled = _run(model, feeds, pipeline.PipelineConfig(dispatch="codegen"))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    names = [gv.name_hint for gv, f in scheduled.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc)]
    assert any("lstm_loop" in n for n in names), names
    assert any(n.endswith("_prepacked") and "matmul" in n for n in names), names
