"""Attention as one oneDNN call in blocks of query rows (tvmopt.onednn.attention):
softmax(q.k^T * scale).v becomes one packed call whose output equals onnxruntime's, for long
and short sequences, static or symbolic; scores that are not softmaxed over their last axis
keep the two batch_matmul calls."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvmopt.library import onednn as od


@pytest.fixture(scope="module", autouse=True)
def extension(onednn_extension):
    return onednn_extension


rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def attention(q_shape, k_shape, v_shape, transpose=True, scale_op="Div", scale=8.0):
    """softmax(q @ k^T (op) scale) @ v: k transposed by a Transpose node, or given as
    (..., d, n) already."""
    nodes = []
    k = "k"
    if transpose:
        perm = list(range(len(k_shape)))
        perm[-2:] = perm[-1], perm[-2]
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=perm))
        k = "kt"
    nodes += [helper.make_node("MatMul", ["q", k], ["s"]),
              helper.make_node(scale_op, ["s", "scale"], ["sd"]),
              helper.make_node("Softmax", ["sd"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
         for n, s in (("q", q_shape), ("k", k_shape), ("v", v_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(scale, np.float32), "scale")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    static = all(isinstance(d, int) for d in (*q_shape, *k_shape, *v_shape))
    feeds = {"q": rand(*q_shape), "k": rand(*k_shape), "v": rand(*v_shape)} if static else None
    return m, feeds


def build_and_check(m, feeds, compute="fp32", tol=1e-4, also=()):
    """Library dispatch in `compute`: {packed func (and each text in `also`): count}, after
    checking the output against onnxruntime's twice (the second run reuses the cached
    primitives)."""
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    target = host_target().to_tvm()
    cfg = pipeline.PipelineConfig(dispatch="library", library_compute=(compute,))
    mod = pipeline.optimize(import_onnx(m).mod, target, cfg, until="dispatch").mod
    text = mod.script(show_meta=False)
    calls = {f: text.count(f'R.call_dps_packed("{f}"') for f in (od.ATTN_FUNC, od.BMM_FUNC)}
    calls.update({t: text.count(t) for t in also})
    vm = relax.VirtualMachine(pipeline.build(mod, target, cfg=cfg, start_after="dispatch"),
                              tvm.cpu())
    ref = ort.InferenceSession(m.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for _ in range(2):
        out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()]).numpy()
        err = np.abs(out - ref).max() / np.abs(ref).max()
        assert err < tol, f"error {err:.3g} ({compute})"
    return calls


def test_long_self_attention_is_one_blocked_call():
    # 1000 query rows: whole blocks and a shorter last one
    m, feeds = attention([1, 4, 1000, 64], [1, 4, 1000, 64], [1, 4, 1000, 64])
    assert build_and_check(m, feeds) == {od.ATTN_FUNC: 1, od.BMM_FUNC: 0}


def test_cross_attention_with_a_pretransposed_key_and_a_multiplied_scale():
    # rank 3 (heads folded into the batch), q shorter than k and v, k already (b, d, n)
    m, feeds = attention([3, 300, 32], [3, 32, 2000], [3, 2000, 48], transpose=False,
                         scale_op="Mul", scale=0.125)
    assert build_and_check(m, feeds) == {od.ATTN_FUNC: 1, od.BMM_FUNC: 0}


def test_long_attention_in_bf16():
    from tvmopt.precision.choice import host_has_bf16

    if not host_has_bf16():
        pytest.skip("this host has no bf16 units (amx_bf16, avx512_bf16)")
    m, feeds = attention([1, 2, 1100, 64], [1, 2, 1100, 64], [1, 2, 1100, 64])
    # bf16 keeps 8 significant bits: errors of a few 1e-3 of the output's range.
    assert build_and_check(m, feeds, compute="bf16", tol=2e-2) == {od.ATTN_FUNC: 1,
                                                                     od.BMM_FUNC: 0}


def test_long_cross_attention_in_bf16_with_a_pretransposed_key():
    from tvmopt.precision.choice import host_has_bf16

    if not host_has_bf16():
        pytest.skip("this host has no bf16 units (amx_bf16, avx512_bf16)")
    # 2000 keys: the scores of a block are computed in several panels of k's columns, here
    # read from a (b, d, n) key at column offsets rather than row offsets
    m, feeds = attention([3, 300, 32], [3, 32, 2000], [3, 2000, 48], transpose=False,
                         scale_op="Mul", scale=0.125)
    assert build_and_check(m, feeds, compute="bf16", tol=2e-2) == {od.ATTN_FUNC: 1,
                                                                     od.BMM_FUNC: 0}


def heads_attention(batch, seq, heads, d, causal=False, fused=False):
    """A transformer's self-attention from (b, s, h*d) projections: the head split (reshape +
    transpose to (b, h, s, d); k straight to (b, h, d, s)), attention, and the head merge.
    `fused`: q, k and v split out of one (b, s, 3*h*d) projection."""
    hd = heads * d
    nodes = [helper.make_node("Split", ["qkv", "sections"], list("qkv"), axis=-1)] if fused else []
    nodes += [helper.make_node("Reshape", [x, "split_shape"], [x + "4"]) for x in "qkv"]
    nodes += [helper.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["qh", "kt"], ["s"]),
              helper.make_node("Mul", ["s", "scale"], ["sd"])]
    scores = "sd"
    inits = [numpy_helper.from_array(np.array([0, 0, heads, d], np.int64), "split_shape"),
             numpy_helper.from_array(np.array([0, 0, hd], np.int64), "merge_shape"),
             numpy_helper.from_array(np.array(d ** -0.5, np.float32), "scale")]
    if fused:
        inits.append(numpy_helper.from_array(np.array([hd] * 3, np.int64), "sections"))
    if causal:
        mask = np.triu(np.full((seq, seq), -1e4, np.float32), 1)
        inits.append(numpy_helper.from_array(mask, "mask"))
        nodes.append(helper.make_node("Add", ["sd", "mask"], ["sm"]))
        scores = "sm"
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vh"], ["y4"]),
              helper.make_node("Transpose", ["y4"], ["ys"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ys", "merge_shape"], ["y"])]
    names = ["qkv"] if fused else list("qkv")
    width = 3 * hd if fused else hd
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [batch, seq, width]) for x in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, {x: rand(batch, seq, width) for x in names}


# short sequences read the strided rows in place; long ones copy each head's rows dense
@pytest.mark.parametrize("compute,seq,causal,fused", [
    ("fp32", 40, False, False), ("fp32", 300, True, False), ("fp32", 1030, True, True),
    ("fp32", 50, False, True), ("bf16", 600, False, False), ("bf16", 70, True, False),
    ("bf16", 520, True, True)])
def test_head_split_and_merge_are_read_and_written_through_strides(compute, seq, causal, fused):
    from tvmopt.precision.choice import host_has_bf16

    if compute == "bf16" and not host_has_bf16():
        pytest.skip("this host has no bf16 units (amx_bf16, avx512_bf16)")
    m, feeds = heads_attention(2, seq, 3, 32, causal, fused)
    calls = build_and_check(m, feeds, compute=compute, tol=1e-4 if compute == "fp32" else 2e-2,
                            also=("R.permute_dims", "R.split"))
    # no transpose kernel is left: the call reads (b, s, h, d) and writes it; q, k and v of
    # one projection are read from it, without a split
    assert calls == {od.ATTN_FUNC: 1, od.BMM_FUNC: 0, "R.permute_dims": 0, "R.split": 0}


def test_short_attention_is_one_call_too():
    m, feeds = attention([2, 4, 7, 16], [2, 4, 7, 16], [2, 4, 7, 16])
    assert build_and_check(m, feeds) == {od.ATTN_FUNC: 1, od.BMM_FUNC: 0}


def test_a_softmax_over_another_axis_keeps_two_matmul_calls():
    m, feeds = attention([1, 2, 64, 16], [1, 2, 64, 16], [1, 2, 64, 16])
    for node in m.graph.node:
        if node.op_type == "Softmax":
            node.attribute[0].i = 2
    assert build_and_check(m, feeds) == {od.ATTN_FUNC: 0, od.BMM_FUNC: 2}


def test_symbolic_sequence_attention_is_one_call_at_every_length():
    import tvm
    from tvm import relax

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import host_target

    shape = ["batch", 2, "seq", 16]
    m, _ = attention(shape, shape, shape)
    target = host_target().to_tvm()
    cfg = pipeline.PipelineConfig(dispatch="library")
    mod = pipeline.optimize(import_onnx(m).mod, target, cfg, until="dispatch").mod
    assert mod.script(show_meta=False).count(f'R.call_dps_packed("{od.ATTN_FUNC}"') == 1
    vm = relax.VirtualMachine(pipeline.build(mod, target, cfg=cfg, start_after="dispatch"),
                              tvm.cpu())
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, s in ((1, 1), (1, 37), (3, 300)):
        feeds = {n: rand(b, 2, s, 16) for n in ("q", "k", "v")}
        ref = sess.run(None, feeds)[0]
        out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()]).numpy()
        assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max(), (b, s)


def masked_attention(b, h, s, d, mask):
    """softmax(q.k^T / 8 masked).v with a causal mask as a constant where() (filling where
    the mask is true, as torch's masked_fill exports), a keep-mask (filling where it is
    false), or an additive padding mask given as an input of shape (b, 1, 1, s)."""
    shape = [b, h, s, d]
    tril = np.tril(np.ones((s, s), bool))
    inits = [numpy_helper.from_array(np.array(8.0, np.float32), "scale"),
             numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf"),
             numpy_helper.from_array(np.array(-1e9, np.float32), "big")]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Div", ["s", "scale"], ["sd"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"]
    feeds = {n: rand(*shape) for n in "qkv"}
    if mask == "causal":
        inits.append(numpy_helper.from_array(~tril, "future"))
        nodes.append(helper.make_node("Where", ["future", "ninf", "sd"], ["sm"]))
    elif mask == "keep":
        inits.append(numpy_helper.from_array(tril.reshape(1, 1, s, s), "allowed"))
        nodes.append(helper.make_node("Where", ["allowed", "sd", "big"], ["sm"]))
    else:
        inputs.append(helper.make_tensor_value_info("pad", TensorProto.FLOAT, [b, 1, 1, s]))
        pad = np.zeros((b, 1, 1, s), np.float32)
        pad[0, ..., s - 5:] = -1e4  # the first sequence's last five tokens are padding
        feeds["pad"] = pad
        nodes.append(helper.make_node("Add", ["sd", "pad"], ["sm"]))
    nodes += [helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    g = helper.make_graph(nodes, "g", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, feeds


@pytest.mark.parametrize("mask", ["causal", "keep", "padding"])
def test_masked_attention_is_one_call(mask):
    m, feeds = masked_attention(2, 3, 300, 32, mask)
    assert build_and_check(m, feeds) == {od.ATTN_FUNC: 1, od.BMM_FUNC: 0}


@pytest.mark.parametrize("length", [257, 700])  # one panel of scores; two, the mask over both
def test_causal_attention_in_bf16(length):
    from tvmopt.precision.choice import host_has_bf16

    if not host_has_bf16():
        pytest.skip("this host has no bf16 units (amx_bf16, avx512_bf16)")
    m, feeds = masked_attention(1, 2, length, 64, "causal")
    assert build_and_check(m, feeds, compute="bf16", tol=2e-2) == {od.ATTN_FUNC: 1,
                                                                     od.BMM_FUNC: 0}
