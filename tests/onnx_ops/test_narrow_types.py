"""8/4/2-bit types (float8 family, float4e2m1, int4/uint4/int2/uint2) end to end.

Each model is compiled to an artifact for x86 and run through `runtime.LoadedModel.run` with the
ml_dtypes arrays a user passes (what `onnx.numpy_helper.to_array` gives), and compared with
`onnx.reference.ReferenceEvaluator`, the spec's own implementation: values exactly (NaN equals
NaN), bit codes too wherever the value is neither NaN nor zero. Inputs cover every code of each
float type, every rounding midpoint (ties) and its neighbours, subnormals, the overflow
thresholds, +-inf and NaN, in both saturate modes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tvmopt.interface.compile import CompileOptions, compile_model
from tvmopt.errors import ImportFailure, ShapeError
from tvmopt.frontend.narrow_types import float_to_int, float_to_int_unspecified
from tvmopt.runtime.loader import load

from tests.harness import load_tvmopt

FLOAT8 = {TP.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn, TP.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
          TP.FLOAT8E5M2: ml_dtypes.float8_e5m2, TP.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz}
SMALL_FLOATS = {TP.FLOAT4E2M1: (ml_dtypes.float4_e2m1fn, 16), TP.FLOAT8E8M0: (ml_dtypes.float8_e8m0fnu, 256)}


def _model(nodes, inputs, outputs, inits=(), opset=25):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 11
    onnx.checker.check_model(model)
    return model


def _build(model, tmp_path, name="m"):
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    res = compile_model(CompileOptions(model=str(path), output=str(tmp_path / f"{name}.tvmopt")),
                        log=lambda *a, **k: None)
    return load(res.artifact.path)


def _same(got: np.ndarray, want: np.ndarray, what: str):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, what
    g, w = got.astype(np.float64), want.astype(np.float64)
    bad = ~((g == w) | (np.isnan(g) & np.isnan(w)))
    assert not bad.any(), (f"{what}: {int(bad.sum())} differ, e.g. got {g[bad][:5]} "
                           f"expected {w[bad][:5]}")
    if got.dtype.itemsize == 1:  # bit codes too, except NaN payloads and the sign of zero
        codes = (w != 0) & ~np.isnan(w)
        np.testing.assert_array_equal(got.view(np.uint8)[codes], want.view(np.uint8)[codes],
                                      err_msg=what)


def _check_all(lm, model, feeds, rules=None):
    """Every output against onnx.reference; `rules` maps an output to (expected, unspecified
    mask) where ONNX leaves some values undefined: those follow tvmopt's rule instead, and the
    rest must still agree with onnx.reference."""
    want = ReferenceEvaluator(model).run(None, feeds)
    got = lm.run(feeds)
    for o, w in zip(model.graph.output, want):
        if rules and o.name in rules:
            expected, unspecified = rules[o.name]
            _same(got[o.name], expected, o.name)
            _same(got[o.name][~unspecified], np.asarray(w)[~unspecified], o.name + " (specified)")
        else:
            _same(got[o.name], w, o.name)


def _probe_values() -> np.ndarray:
    """float32 values hitting every code, midpoint (tie), neighbour and threshold of every type."""
    vals = [0.0, np.inf, np.nan, 1e-30, 3.0e38, 1e9, 0.3, 1.0 / 3, np.float32(1.4e-45)]
    bits_of = {ml_dtypes.float4_e2m1fn: 4, ml_dtypes.float6_e2m3fn: 6, ml_dtypes.float6_e3m2fn: 6}
    for dt in list(FLOAT8.values()) + list(bits_of):
        bits = bits_of.get(dt, 8)
        v = np.unique(np.arange(1 << bits, dtype=np.uint8).view(dt).astype(np.float64))
        v = v[np.isfinite(v) & (v >= 0)]
        top = v[-1] + (v[-1] - v[-2])  # the first value past the largest finite one
        v = np.append(v, top)
        mids = (v[:-1] + v[1:]) / 2
        vals += list(v) + list(mids)
    e8 = np.ldexp(1.0, np.arange(-127, 128))
    vals += list(e8) + list(1.5 * e8[:-1])
    base = np.array(vals, dtype=np.float32)
    base = base[np.isfinite(base) | np.isnan(base) | np.isinf(base)]
    up = np.nextafter(base, np.float32(np.inf))
    down = np.nextafter(base, np.float32(-np.inf))
    rnd = np.random.default_rng(0).standard_normal(200).astype(np.float32) * 100
    x = np.concatenate([base, up, down, rnd])
    return np.concatenate([x, -x]).astype(np.float32)


def test_float_to_float8_float4_e8m0_every_mode():
    x = _probe_values()
    with np.errstate(over="ignore"):
        x16 = x.astype(np.float16)
    nodes, outs = [], []
    for to in list(FLOAT8) + [TP.FLOAT4E2M1]:
        for sat in (1, 0):
            name = f"{TP.DataType.Name(to)}_sat{sat}"
            nodes.append(helper.make_node("Cast", ["x"], [name], to=to, saturate=sat))
            outs.append(helper.make_tensor_value_info(name, to, [len(x)]))
    for to in FLOAT8:  # from float16 too
        name = f"f16_{TP.DataType.Name(to)}"
        nodes.append(helper.make_node("Cast", ["x16"], [name], to=to, saturate=0))
        outs.append(helper.make_tensor_value_info(name, to, [len(x)]))
    for mode in ("up", "down", "nearest"):
        for sat in (1, 0):
            name = f"e8m0_{mode}_sat{sat}"
            nodes.append(helper.make_node("Cast", ["x"], [name], to=TP.FLOAT8E8M0, saturate=sat,
                                          round_mode=mode))
            outs.append(helper.make_tensor_value_info(name, TP.FLOAT8E8M0, [len(x)]))
    model = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [len(x)]),
                           helper.make_tensor_value_info("x16", TP.FLOAT16, [len(x)])], outs)
    lm = load_tvmopt(model)
    assert [o.dtype for o in lm.outputs][:2] == ["float8_e4m3fn", "float8_e4m3fn"]
    _check_all(lm, model, {"x": x, "x16": x16})


def test_every_code_decodes():
    feeds, inputs, nodes, outs = {}, [], [], []
    types = {k: (v, 256) for k, v in FLOAT8.items()} | SMALL_FLOATS
    for k, (dt, n) in types.items():
        name = TP.DataType.Name(k).lower()
        feeds[name] = np.arange(n, dtype=np.uint8).view(dt)
        inputs.append(helper.make_tensor_value_info(name, k, [n]))
        for to in (TP.FLOAT, TP.FLOAT16):
            out = f"{name}_to_{TP.DataType.Name(to).lower()}"
            nodes.append(helper.make_node("Cast", [name], [out], to=to))
            outs.append(helper.make_tensor_value_info(out, to, [n]))
    # float8 -> float8 (decode then encode) and a narrow output that is only moved
    nodes.append(helper.make_node("Cast", ["float8e5m2"], ["e5m2_to_e4m3fn"], to=TP.FLOAT8E4M3FN))
    outs.append(helper.make_tensor_value_info("e5m2_to_e4m3fn", TP.FLOAT8E4M3FN, [256]))
    nodes.append(helper.make_node("Reshape", ["float8e4m3fn", "shape"], ["moved"]))
    outs.append(helper.make_tensor_value_info("moved", TP.FLOAT8E4M3FN, [16, 16]))
    shape = numpy_helper.from_array(np.array([16, 16], np.int64), "shape")
    model = _model(nodes, inputs, outs, [shape])
    lm = load_tvmopt(model)
    assert lm.inputs[0].dtype == "float8_e4m3fn"
    _check_all(lm, model, feeds)


def test_int4_uint4_int2_uint2_in_and_out(tmp_path):
    rng = np.random.default_rng(1)
    feeds = {"i4": rng.integers(-8, 8, (3, 5)).astype(ml_dtypes.int4),
             "u4": rng.integers(0, 16, (3, 5)).astype(ml_dtypes.uint4),
             "i2": rng.integers(-2, 2, (3, 5)).astype(ml_dtypes.int2),
             "u2": rng.integers(0, 4, (3, 5)).astype(ml_dtypes.uint2),
             "f": np.array([-9.7, -8.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 7.5, 8.4, 15.5, 16, 100,
                            -100, 3.99], np.float32).reshape(3, 5)}
    elem = {"i4": TP.INT4, "u4": TP.UINT4, "i2": TP.INT2, "u2": TP.UINT2, "f": TP.FLOAT}
    inputs = [helper.make_tensor_value_info(k, elem[k], [3, 5]) for k in feeds]
    nodes, outs = [], []

    def cast(src, to):
        name = f"{src}_to_{TP.DataType.Name(to).lower()}"
        nodes.append(helper.make_node("Cast", [src], [name], to=to))
        outs.append(helper.make_tensor_value_info(name, to, [3, 5]))

    for src in ("i4", "u4", "i2", "u2"):
        cast(src, TP.FLOAT)
        cast(src, TP.INT8)
    rules = {}
    for to in (TP.INT4, TP.UINT4, TP.INT2, TP.UINT2):  # float -> narrow int: truncate and wrap
        cast("f", to)
        dt = TP.DataType.Name(to).lower()
        rules[f"f_to_{dt}"] = (float_to_int(feeds["f"], dt), float_to_int_unspecified(feeds["f"], dt))
    cast("i4", TP.INT32)
    nodes.append(helper.make_node("Transpose", ["u4"], ["u4_t"]))  # a narrow output, moved only
    outs.append(helper.make_tensor_value_info("u4_t", TP.UINT4, [5, 3]))
    model = _model(nodes, inputs, outs)
    lm = _build(model, tmp_path)
    assert [i.dtype for i in lm.inputs] == ["int4", "uint4", "int2", "uint2", "float32"]
    _check_all(lm, model, feeds, rules)
    # the manifest keeps ONNX's types; a feed of the carrier type is refused by name
    assert {o.name: o.dtype for o in lm.outputs}["u4_t"] == "uint4"
    bad = dict(feeds, i4=feeds["i4"].astype(np.int8))
    with pytest.raises(ShapeError, match="input 'i4': dtype int8, expected int4"):
        lm.run(bad)


def test_quantize_dequantize_narrow_and_blocked(tmp_path):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 7)) * 3).astype(np.float32)
    x[0, :3] = [1e6, -1e6, 0.25]  # saturation / overflow, a tie
    scale_b = (rng.random((4, 3)) + 0.2).astype(np.float32)  # blocks of 3 along axis 1 (3+3+1)
    zp_b = rng.integers(-3, 3, (4, 3)).astype(ml_dtypes.int4)
    inits = [numpy_helper.from_array(scale_b, "scale_b"), numpy_helper.from_array(zp_b, "zp_b"),
             numpy_helper.from_array(np.array(0.5, np.float32), "s"),
             numpy_helper.from_array(np.array(0, ml_dtypes.float8_e4m3fn), "zp_f8"),
             numpy_helper.from_array(np.array(1, ml_dtypes.uint2), "zp_u2"),
             numpy_helper.from_array(np.array(0.5, ml_dtypes.float4_e2m1fn), "zp_f4")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale_b", "zp_b"], ["q_i4"], axis=1, block_size=3),
        helper.make_node("DequantizeLinear", ["q_i4", "scale_b", "zp_b"], ["dq_i4"], axis=1,
                         block_size=3),
        helper.make_node("QuantizeLinear", ["x", "s", "zp_f8"], ["q_f8"], saturate=0),
        helper.make_node("DequantizeLinear", ["q_f8", "s", "zp_f8"], ["dq_f8"]),
        helper.make_node("QuantizeLinear", ["x", "s", "zp_u2"], ["q_u2"]),
        helper.make_node("QuantizeLinear", ["x", "s", "zp_f4"], ["q_f4"]),
        helper.make_node("DequantizeLinear", ["q_f4", "s"], ["dq_f4"]),
    ]
    types = {"q_i4": TP.INT4, "dq_i4": TP.FLOAT, "q_f8": TP.FLOAT8E4M3FN, "dq_f8": TP.FLOAT,
             "q_u2": TP.UINT2, "q_f4": TP.FLOAT4E2M1, "dq_f4": TP.FLOAT}
    outs = [helper.make_tensor_value_info(k, v, [4, 7]) for k, v in types.items()]
    model = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [4, 7])], outs, inits)
    lm = _build(model, tmp_path)
    _check_all(lm, model, {"x": x})


def test_int4_blocked_dequantize_matmul_compile_verify(cli, tmp_path):
    """The int4 weight-only LLM export pattern: DequantizeLinear(int4, block_size) -> MatMul."""
    rng = np.random.default_rng(3)
    k, n, block = 14, 8, 4  # 4 blocks along K, the last one short
    w = rng.integers(-8, 8, (k, n)).astype(ml_dtypes.int4)
    scale = (rng.random((4, n)) * 0.1 + 0.01).astype(np.float32)
    zp = rng.integers(-2, 2, (4, n)).astype(ml_dtypes.int4)
    model = _model(
        [helper.make_node("DequantizeLinear", ["w", "scale", "zp"], ["wf"], axis=0, block_size=block),
         helper.make_node("MatMul", ["x", "wf"], ["y"]),
         # a float8 output too: onnxruntime returns its raw codes, verify must read them as such
         helper.make_node("QuantizeLinear", ["y", "qs"], ["y8"], output_dtype=TP.FLOAT8E4M3FN)],
        [helper.make_tensor_value_info("x", TP.FLOAT, [2, k])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, n]),
         helper.make_tensor_value_info("y8", TP.FLOAT8E4M3FN, [2, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scale, "scale"),
         numpy_helper.from_array(zp, "zp"), numpy_helper.from_array(np.array(0.01, np.float32), "qs")],
        opset=21)
    path = tmp_path / "int4_mm.onnx"
    onnx.save(model, str(path))
    out = tmp_path / "int4_mm.tvmopt"
    res = cli("compile", path, "-o", out, "--verify")
    assert res.exit_code == 0, res.output
    assert "verify y8: max abs err 0.00e+00" in res.output
    x = rng.standard_normal((2, k)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = load(out).run({"x": x})
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-5, atol=1e-5)
    assert got["y8"].dtype == want[1].dtype


def test_narrow_type_inside_a_subgraph_is_refused():
    from tvmopt.frontend.importer import import_onnx

    branch = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["c"], to=TP.FLOAT8E4M3FN),
         helper.make_node("Cast", ["c"], ["y"], to=TP.FLOAT)], "b", [],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2])])
    model = _model([helper.make_node("If", ["cond"], ["out"], then_branch=branch, else_branch=branch)],
                   [helper.make_tensor_value_info("cond", TP.BOOL, []),
                    helper.make_tensor_value_info("x", TP.FLOAT, [2])],
                   [helper.make_tensor_value_info("out", TP.FLOAT, [2])])
    with pytest.raises(ImportFailure, match="8/4/2-bit types inside control-flow subgraphs"):
        import_onnx(model)


def test_cli_run_with_int4_npz(cli, tmp_path):
    """`tvmopt run --inputs in.npz`: np.savez stores ml_dtypes arrays as raw bytes (V1)."""
    model = _model([helper.make_node("Cast", ["q"], ["f"], to=TP.FLOAT),
                    helper.make_node("Identity", ["q"], ["same"])],
                   [helper.make_tensor_value_info("q", TP.INT4, [4])],
                   [helper.make_tensor_value_info("f", TP.FLOAT, [4]),
                    helper.make_tensor_value_info("same", TP.INT4, [4])])
    path, art = tmp_path / "q.onnx", tmp_path / "q.tvmopt"
    onnx.save(model, str(path))
    assert cli("compile", path, "-o", art).exit_code == 0
    q = np.array([-8, -1, 0, 7], ml_dtypes.int4)
    np.savez(tmp_path / "in.npz", q=q)
    res = cli("run", art, "--inputs", tmp_path / "in.npz", "--outputs", tmp_path / "out.npz")
    assert res.exit_code == 0, res.output
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["f"], [-8, -1, 0, 7])
        assert out["same"].view(ml_dtypes.int4).tolist() == q.tolist()
    np.savez(tmp_path / "bad.npz", q=q.astype(np.int8))
    bad = cli("run", art, "--inputs", tmp_path / "bad.npz")
    assert bad.exit_code != 0 and "input 'q': dtype int8, expected int4" in bad.output


def test_nonzero_float8_zero_point_is_refused():
    from tvmopt.frontend.importer import import_onnx

    zp = numpy_helper.from_array(np.array(1.0, ml_dtypes.float8_e4m3fn), "zp")
    s = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    model = _model([helper.make_node("DequantizeLinear", ["x", "s", "zp"], ["y"])],
                   [helper.make_tensor_value_info("x", TP.FLOAT8E4M3FN, [3])],
                   [helper.make_tensor_value_info("y", TP.FLOAT, [3])], [s, zp])
    with pytest.raises(ImportFailure, match="float8_e4m3fn zero point must be 0"):
        import_onnx(model)


def test_float6_both_ways():
    """float6 e2m3/e3m2 (Cast at opset 28): no inf/NaN, so casts saturate."""
    x = _probe_values()
    nodes, outs = [], []
    for to in (TP.FLOAT6E2M3, TP.FLOAT6E3M2):
        name = TP.DataType.Name(to).lower()
        nodes += [helper.make_node("Cast", ["x"], [name], to=to),
                  helper.make_node("Cast", [name], [name + "_back"], to=TP.FLOAT)]
        outs += [helper.make_tensor_value_info(name, to, [len(x)]),
                 helper.make_tensor_value_info(name + "_back", TP.FLOAT, [len(x)])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [len(x)])], outs, opset=28)
    _check_all(load_tvmopt(model), model, {"x": x})
