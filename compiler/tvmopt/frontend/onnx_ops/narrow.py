"""Narrow types carried in bytes: the ONNX-level retyping and the exact conversions in Relax.

See `tvmopt.frontend.narrow_types` for the carriers. Two parts:

- `carry_in_bytes(model)`: before import, every graph input/output, initializer and Constant of
  a narrow type is retyped to its carrier (int8/uint8), and each Cast/CastLike/QuantizeLinear/
  DequantizeLinear is annotated with the ONNX element types of its inputs and outputs
  (`tvmopt_in`, `tvmopt_out`), since the carrier alone cannot say whether a uint8 holds a
  float8_e4m3fn code or a uint4. Ops that only move data (Reshape, Concat, Gather, ...) work on
  carriers unchanged; ONNX allows no arithmetic on these types.
- `decode` / `encode_float` / `encode_int`: the conversions, made of ordinary Relax ops so they
  build on every target. Decoding is a `take` from a table built with ml_dtypes (exact, NaN,
  inf, subnormals, FNUZ, e8m0). Encoding counts how many rounding thresholds lie below |x| by
  binary search over a sorted table: the thresholds are the midpoints between consecutive
  representable values, with ties to the even code (onnx.reference casts through ml_dtypes,
  which rounds to nearest even), then sign, NaN and ONNX's saturate rule.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ...errors import ImportFailure
from ..narrow_types import NarrowType, by_name, by_onnx
from ..onnx_model import infer_shapes_or_as_is

# Ops whose converters need to know the ONNX types hidden behind carriers.
ANNOTATED = {"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear"}
_DEFAULT_DOMAINS = ("", "ai.onnx")


# ------------------------------------------------------------------------------------------
# ONNX-level retyping


def _carrier_tensor(tensor):
    from onnx import numpy_helper

    from ..narrow_types import to_carrier

    return numpy_helper.from_array(to_carrier(numpy_helper.to_array(tensor)), tensor.name)


def _subgraphs(node):
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def _graph_mentions_narrow(graph) -> str | None:
    """A description of the first narrow type found in a (sub)graph, else None."""
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        t = by_onnx(vi.type.tensor_type.elem_type)
        if t:
            return f"value '{vi.name}' of type {t.name}"
    for init in graph.initializer:
        if by_onnx(init.data_type):
            return f"initializer '{init.name}' of type {by_onnx(init.data_type).name}"
    for node in graph.node:
        for attr in node.attribute:
            if attr.name in ("to", "output_dtype") and by_onnx(attr.i):
                return f"node '{node.name or node.op_type}' ({node.op_type} to {by_onnx(attr.i).name})"
            if attr.HasField("t") and by_onnx(attr.t.data_type):
                return f"node '{node.name or node.op_type}' ({node.op_type} of {by_onnx(attr.t.data_type).name})"
        for g in _subgraphs(node):
            found = _graph_mentions_narrow(g)
            if found:
                return found
    return None


def _needs_rewrite(model) -> bool:
    g = model.graph
    if _graph_mentions_narrow(g):
        return True
    # blocked quantization (block_size > 0) also goes through tvmopt's Q/DQ converters
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") and
               any(a.name == "block_size" and a.i for a in n.attribute) for n in g.node)


def carry_in_bytes(model):
    """Retype narrow tensors to their carriers and annotate conversions with ONNX types.

    Returns:
        (model, narrow_outputs): the rewritten model (the input is not modified) and the ONNX
        dtype name of each graph output of a narrow type.

    Raises:
        ImportFailure: a narrow type inside a control-flow subgraph (If/Loop/Scan body).
    """
    import onnx
    from onnx import helper

    if not _needs_rewrite(model):
        return model, {}
    for node in model.graph.node:
        for g in _subgraphs(node):
            found = _graph_mentions_narrow(g)
            if found:
                raise ImportFailure(f"node '{node.name or node.op_type}' ({node.op_type}): 8/4/2-bit "
                                    f"types inside control-flow subgraphs are not supported ({found})")
    inferred = infer_shapes_or_as_is(model)  # declared types where inference has none
    g = inferred.graph
    elem = {vi.name: vi.type.tensor_type.elem_type
            for vi in list(g.input) + list(g.value_info) + list(g.output)}
    elem.update({t.name: t.data_type for t in g.initializer})
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "Constant" and attr.HasField("t"):
                elem[node.output[0]] = attr.t.data_type

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    # declared (or, where missing, inferred) ONNX types of the outputs, for the signature
    narrow_outputs = {o.name: by_onnx(o.type.tensor_type.elem_type or elem.get(o.name, 0)).name
                      for o in graph.output
                      if by_onnx(o.type.tensor_type.elem_type or elem.get(o.name, 0))}
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        t = by_onnx(vi.type.tensor_type.elem_type)
        if t:
            vi.type.tensor_type.elem_type = t.carrier_onnx
    for k, init in enumerate(graph.initializer):
        if by_onnx(init.data_type):
            graph.initializer[k].CopyFrom(_carrier_tensor(init))
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t") and by_onnx(attr.t.data_type):
                attr.t.CopyFrom(_carrier_tensor(attr.t))
        if node.op_type in ANNOTATED and node.domain in _DEFAULT_DOMAINS:
            ins = [elem.get(i, 0) if i else 0 for i in node.input]
            outs = [elem.get(o, 0) for o in node.output]
            if node.op_type == "Cast":
                outs = [a.i for a in node.attribute if a.name == "to"][:1] or outs
            del_names = {"tvmopt_in", "tvmopt_out"}
            keep = [a for a in node.attribute if a.name not in del_names]
            del node.attribute[:]
            node.attribute.extend(keep + [helper.make_attribute("tvmopt_in", ins),
                                          helper.make_attribute("tvmopt_out", outs)])
    return out, narrow_outputs


def onnx_types(attr: dict, inputs=(), op: str = "") -> tuple[list[int], list[int]] | None:
    """The (input, output) ONNX element types recorded by carry_in_bytes, or None.

    Raises:
        ValueError: an input's ONNX type is unknown (shape inference failed) while its Relax
            dtype is a carrier: it might hold a narrow type, and guessing would be silent.
    """
    if "tvmopt_in" not in attr:
        return None
    ins, outs = list(attr.pop("tvmopt_in")), list(attr.pop("tvmopt_out"))
    for k, (elem, x) in enumerate(zip(ins, inputs)):
        dt = getattr(getattr(x, "ty", None), "dtype", None) if x is not None else None
        if not elem and str(dt) in ("int8", "uint8"):
            raise ValueError(f"{op} input {k}: its ONNX type is unknown (shape inference failed) "
                             f"and its {dt} tensor may carry an 8/4/2-bit type; declare the type "
                             "in the model's value_info")
    return ins, outs


def require_zero(x, t: NarrowType, what: str) -> None:
    """float8 zero points must be zero (the spec; onnx.reference refuses others)."""
    import tvm

    if isinstance(x, tvm.ir.expr.Constant) and \
            np.any(decode_table(t.name)[x.value.numpy().astype(np.int64)] != 0):
        raise ValueError(f"{what}: a {t.name} zero point must be 0")


def onnx_dtype_name(elem_type: int) -> str | None:
    from onnx import helper

    if not elem_type:
        return None
    try:
        return str(helper.tensor_dtype_to_np_dtype(elem_type))
    except KeyError:  # a code onnx has no numpy type for
        return None


# ------------------------------------------------------------------------------------------
# Tables


def _code_values(t: NarrowType) -> np.ndarray:
    """float64 value of every code 0..2^bits-1."""
    codes = np.arange(1 << t.bits, dtype=np.uint8)
    return codes.view(t.np_dtype).astype(np.float64)


@lru_cache(maxsize=None)
def decode_table(name: str) -> np.ndarray:
    """float32 value of every byte 0..255 read as a code of `name` (high bits ignored)."""
    t = by_name(name)
    vals = _code_values(t).astype(np.float32)
    return vals[np.arange(256) & ((1 << t.bits) - 1)]


@lru_cache(maxsize=None)
def _layout(name: str) -> dict:
    """Sign bit, largest finite positive code, overflow code and NaN code of a float type."""
    t = by_name(name)
    vals = _code_values(t)
    sign = 1 << (t.bits - 1)
    positive = vals[:sign]
    finite = np.flatnonzero(np.isfinite(positive))
    max_code = int(finite.max())
    fnuz = name.endswith("fnuz")
    # The code after the largest finite one: inf (e5m2) or NaN (e4m3fn: 0x7f, FNUZ: 0x80).
    has_overflow = max_code + 1 < len(vals) and not np.isfinite(vals[max_code + 1])
    nan_codes = np.flatnonzero(np.isnan(vals))
    # NaN codes as ml_dtypes writes a positive NaN; types without NaN take -0 (as ml_dtypes does)
    nan_code = {"float8_e5m2": 0x7E}.get(name, int(nan_codes[0]) if nan_codes.size else sign)
    return {"sign": sign, "max_code": max_code, "max": float(vals[max_code]), "fnuz": fnuz,
            "has_overflow": has_overflow, "nan_code": nan_code, "vals": vals}


def _as_ge(values: np.ndarray, tie_up: np.ndarray, dtype) -> np.ndarray:
    """Thresholds to compare with >=: a strict '>' threshold becomes the next value up."""
    v = values.astype(dtype)
    return np.where(tie_up, v, np.nextafter(v, np.array(np.inf, dtype))).astype(dtype)


def _padded(table: np.ndarray) -> tuple[np.ndarray, int]:
    """Pad with NaN (never >=) to 2^k - 1 entries for a k-step binary search."""
    k = max(1, int(np.ceil(np.log2(len(table) + 1))))
    out = np.full((1 << k) - 1, np.nan, table.dtype)
    out[:len(table)] = table
    return out, k


@lru_cache(maxsize=None)
def encode_table(name: str, dtype: str) -> tuple[np.ndarray, int]:
    """Rounding thresholds of a sign-magnitude float type: |x| >= T[c-1] means code >= c."""
    lay = _layout(name)
    vals, m = lay["vals"], lay["max_code"]
    pos = list(vals[:m + 1])
    if lay["has_overflow"]:  # the first value past the largest finite one, same spacing
        pos.append(pos[-1] + (pos[-1] - pos[-2]))
    pos = np.array(pos)
    mids = (pos[:-1] + pos[1:]) / 2  # exact: one more mantissa bit than the type has
    tie_up = (np.arange(1, len(pos)) % 2) == 0  # a tie goes to the even code
    return _padded(_as_ge(mids, tie_up, np.dtype(dtype)))


@lru_cache(maxsize=None)
def e8m0_table(round_mode: str) -> tuple[np.ndarray, int]:
    """Thresholds of float8e8m0 (a power of two, 2^(c-127)), as onnx.numpy_helper.to_float8e8m0.

    up: the smallest power >= |x| (0 stays code 0); down: the exponent of |x|; nearest: round
    up from 1.5 * 2^e, and from just above 2^-127 for float32 subnormals.
    """
    powers = np.ldexp(1.0, np.arange(1, 255) - 127)  # values of codes 1..254
    if round_mode == "up":
        t = np.concatenate([[0.0], powers])
        ge = _as_ge(t, np.zeros(len(t), bool), np.float32)
    elif round_mode == "down":
        ge = powers.astype(np.float32)
    elif round_mode == "nearest":
        t = np.concatenate([[np.ldexp(1.0, -127)], 1.5 * powers])
        ge = _as_ge(t, np.arange(len(t)) > 0, np.float32)
    else:
        raise ValueError(f"Cast to float8e8m0: unknown round_mode '{round_mode}' "
                         "(up, down, nearest)")
    return _padded(ge)


# ------------------------------------------------------------------------------------------
# Relax builders


def _const(value, dtype):
    from tvm import relax

    return relax.const(np.asarray(value, dtype=dtype), dtype)


def _dtype(bb, x) -> str:
    return str(bb.normalize(x).ty.dtype)


def decode(bb, x, t: NarrowType, out_dtype: str = "float32"):
    """Carrier -> value in `out_dtype` (float types through their code table)."""
    from tvm import relax

    if not t.is_float:
        return relax.op.astype(x, out_dtype)
    table = relax.const(decode_table(t.name), "float32")
    y = relax.op.take(table, relax.op.astype(x, "int32"), axis=0, mode="clip")  # always in range
    return y if out_dtype == "float32" else relax.op.astype(y, out_dtype)


def _search(bb, a, table: np.ndarray, steps: int):
    """The number of entries of the sorted `table` that are <= a, by binary search.

    One TE kernel (a stage per step): a chain of Relax ops would cut fusion at every table
    lookup (a gather is opaque to FuseOps), giving ~4 kernels per step.
    """
    from tvm import relax, te
    from tvm import tirx as tir  # TVM 0.27 renamed tir to tirx

    def search(a_t, table_t):
        code = te.compute(a_t.shape, lambda *i: tir.const(0, "int32"), name="code")
        def stepper(prev, bit):  # code += 2^bit where the threshold below that is reached
            def step(*i):
                cand = prev(*i) + (1 << bit)
                return tir.Select(a_t(*i) >= table_t[cand - 1], cand, prev(*i))
            return step

        for bit in reversed(range(steps)):
            code = te.compute(a_t.shape, stepper(code, bit), name=f"code_bit{bit}")
        return code

    return bb.emit_te(search, bb.emit(a), relax.const(table, str(table.dtype)))


def encode_float(bb, x, t: NarrowType, saturate: bool = True, round_mode: str = "up"):
    """Value -> uint8 carrier holding the code of float type `t`, as ONNX's Cast."""
    from tvm import relax

    src = _dtype(bb, x)
    if t.name == "float8_e8m0fnu":
        x = relax.op.astype(x, "float32")  # to_float8e8m0 works on float32
        table, steps = e8m0_table(round_mode)
        code = _search(bb, relax.op.abs(x), table, steps)
        if saturate:
            code = relax.op.minimum(code, _const(254, "int32"))
        special = relax.op.logical_or(relax.op.isnan(x), relax.op.isinf(x))
        return relax.op.astype(relax.op.where(special, _const(255, "int32"), code), "uint8")

    compute = "float64" if src == "float64" or src.startswith("int64") or src.startswith("uint64") \
        else "float32"
    if src != compute:
        x = relax.op.astype(x, compute)
    lay = _layout(t.name)
    a = relax.op.abs(x)
    if saturate and lay["has_overflow"]:
        a = relax.op.minimum(a, _const(lay["max"], compute))
    table, steps = encode_table(t.name, compute)
    code = _search(bb, a, table, steps)
    neg = relax.op.less(x, _const(0, compute))
    with_sign = relax.op.add(code, _const(lay["sign"], "int32"))
    if lay["fnuz"]:  # no negative zero; the overflow code 0x80 (NaN) has no sign either
        neg = relax.op.logical_and(neg, relax.op.logical_and(
            relax.op.not_equal(code, _const(0, "int32")),
            relax.op.not_equal(code, _const(lay["sign"], "int32"))))
    code = relax.op.where(neg, with_sign, code)
    code = relax.op.where(relax.op.isnan(x), _const(lay["nan_code"], "int32"), code)
    return relax.op.astype(code, "uint8")


def wrap_int(bb, x, t: NarrowType):
    """Value -> carrier of integer type `t`: floats truncate toward zero, then the low bits are
    kept (two's complement); NaN/Inf give 0. ONNX leaves out-of-range float casts undefined:
    this is tvmopt's documented rule, `narrow_types.float_to_int` is its numpy reference."""
    from tvm import relax

    src = _dtype(bb, x)
    if src.startswith("float") or src.startswith("bfloat"):
        finite = relax.op.isfinite(x)
        x = relax.op.where(finite, relax.op.trunc(x), relax.op.zeros_like(x))
    v = relax.op.astype(x, "int64")
    mask = (1 << t.bits) - 1
    v = relax.op.bitwise_and(v, _const(mask, "int64"))
    if t.carrier == "int8":  # sign-extend the low bits
        sign = _const(1 << (t.bits - 1), "int64")
        v = relax.op.subtract(relax.op.bitwise_xor(v, sign), sign)
    return relax.op.astype(v, t.carrier)
