"""Int8 ops of quantized models: QLinearMatMul, QLinearConv, ConvInteger.

TVM 0.27's Relax frontend has none of them. Each is computed as the ONNX spec (and its reference
implementation) defines: widen to int32, subtract the zero points, accumulate in int32, then
requantize: multiply by `x_scale * w_scale / y_scale`, round half to even, add the output zero
point and saturate to the output type. Scales and zero points may be run-time tensors.
"""

from __future__ import annotations

import numpy as np

from . import register, tvm_converter



def _input(inputs, i):
    return inputs[i] if len(inputs) > i else None


def _ndim(bb, expr) -> int:
    return len(bb.normalize(expr).ty.shape)


def _dtype(bb, expr) -> str:
    return str(bb.normalize(expr).ty.dtype)


def _widen(bb, x, zero_point, channel_axis: int | None = None):
    """int32(x) - int32(zero_point); a 1-D zero point is per channel along `channel_axis`."""
    from tvm import relax

    x = relax.op.astype(x, "int32")
    if zero_point is None:
        return x
    zp = relax.op.astype(zero_point, "int32")
    if channel_axis is not None:
        zp = _per_channel(bb, zp, channel_axis, _ndim(bb, x))
    return relax.op.subtract(x, zp)


def _per_channel(bb, value, axis: int, ndim: int):
    """Reshape a 1-D per-channel tensor so it broadcasts along `axis` of an ndim tensor."""
    from tvm import relax

    if _ndim(bb, value) != 1:
        return value
    axis = axis % ndim
    trailing = ndim - 1 - axis
    return relax.op.expand_dims(value, axis=list(range(1, trailing + 1))) if trailing else value


def _requantize(bb, acc, multiplier, y_zero_point, out_dtype: str):
    """saturate(round_half_even(acc * multiplier) + zero_point) as out_dtype."""
    from tvm import relax

    info = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
            "uint16": (0, 65535)}
    if out_dtype not in info:
        raise ValueError(f"quantized output type {out_dtype} is not supported (int8/uint8/int16/uint16)")
    lo, hi = info[out_dtype]
    # float64, as the reference computes int32 * float: a float32 product rounds differently
    # at .5 ties for large accumulators.
    scaled = relax.op.multiply(relax.op.astype(acc, "float64"), relax.op.astype(multiplier, "float64"))
    rounded = relax.op.round(scaled)  # TVM's round is round-half-to-even, as np.rint
    if y_zero_point is not None:
        rounded = relax.op.add(rounded, relax.op.astype(y_zero_point, "float64"))
    return _saturate(bb, rounded, lo, hi, out_dtype)


def _saturate(bb, value, lo: int, hi: int, out_dtype: str):
    """Float -> integer type: clip to [lo, hi] in float, NaN -> lo.

    Clipped before the cast (a float -> int cast of +-inf or NaN is undefined: LLVM poison), and
    NaN sent to the minimum explicitly (clip passes NaN through), which is what onnxruntime,
    OpenVINO and onnx.reference compute (passes/qdq_legalize.py).
    """
    from tvm import relax

    value = bb.normalize(value)
    clipped = relax.op.where(relax.op.isnan(value), relax.const(lo, _dtype(bb, value)),
                             relax.op.clip(value, lo, hi))
    return relax.op.astype(clipped, out_dtype)


def _multiplier(bb, x_scale, w_scale, y_scale):
    from tvm import relax

    return relax.op.divide(relax.op.multiply(x_scale, w_scale), y_scale)


def _conv_int32(bb, x, w, attr, opset):
    """Integer convolution through TVM's Conv converter (padding, auto_pad, 1-3 spatial dims)."""
    x, w = bb.normalize(x), bb.normalize(w)  # TVM's converter reads their shapes
    return tvm_converter("Conv", max(opset, 11))(bb, [x, w, None], dict(attr), None)


@register("QLinearMatMul")
def q_linear_mat_mul(bb, inputs, attr, params, opset):
    from tvm import relax

    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = (list(inputs) + [None] * 8)[:8]
    a_i = _widen(bb, a, a_zp)
    if a_zp is not None and _ndim(bb, a_zp) == 1:  # per row of a: [M] -> [M, 1]
        a_i = relax.op.subtract(relax.op.astype(a, "int32"),
                                relax.op.expand_dims(relax.op.astype(a_zp, "int32"), -1))
    b_i = _widen(bb, b, b_zp)  # per column of b: [N] broadcasts along the last axis
    acc = relax.op.matmul(a_i, b_i, out_dtype="int32")
    if _ndim(bb, a_scale) == 1:
        a_scale = relax.op.expand_dims(a_scale, -1)
    mult = _multiplier(bb, a_scale, b_scale, y_scale)
    out_dtype = _dtype(bb, y_zp if y_zp is not None else a)
    return _requantize(bb, acc, mult, y_zp, out_dtype)


@register("ConvInteger")
def conv_integer(bb, inputs, attr, params, opset):
    x, w, x_zp, w_zp = (list(inputs) + [None] * 4)[:4]
    return _conv_int32(bb, _widen(bb, x, x_zp), _widen(bb, w, w_zp, channel_axis=0),
                       attr, opset)


@register("QLinearConv")
def q_linear_conv(bb, inputs, attr, params, opset):
    from tvm import relax

    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias = (list(inputs) + [None] * 9)[:9]
    acc = _conv_int32(bb, _widen(bb, x, x_zp), _widen(bb, w, w_zp, channel_axis=0),
                      attr, opset)
    ndim = _ndim(bb, acc)
    if bias is not None:
        acc = relax.op.add(acc, _per_channel(bb, relax.op.astype(bias, "int32"), 1, ndim))
    w_scale = _per_channel(bb, w_scale, 1, ndim)
    mult = _multiplier(bb, x_scale, w_scale, y_scale)
    out_dtype = _dtype(bb, y_zp if y_zp is not None else x)
    return _requantize(bb, acc, mult, y_zp, out_dtype)


# ------------------------------------------------------------------------------------------
# QuantizeLinear / DequantizeLinear with 8/4/2-bit types or blocked quantization
#
# TVM's converters cover int8/uint8/int16 per-tensor and per-axis quantization; they are kept
# for those. A narrow type (float8, float4, int4/uint4, int2/uint2: see narrow.py) or a
# `block_size` (opset 21+, THE pattern of int4 weight-only LLM exports) goes through these,
# computed as onnx.reference's op_quantize_linear / op_dequantize_linear.

_INT_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
               "uint16": (0, 65535)}


def _static_shape(bb, expr) -> list:
    return [int(v) if hasattr(v, "value") else v for v in bb.normalize(expr).ty.shape.values]


def _broadcast_param(bb, value, x, axis: int, block_size: int):
    """Scale or zero point made broadcastable to x (onnx.reference's _quant_utils.reshape_input)."""
    from tvm import relax

    shape = _static_shape(bb, value)
    ndim = _ndim(bb, x)
    if not shape:
        return value
    if all(isinstance(d, int) for d in shape) and int(np.prod(shape)) == 1:
        return relax.op.reshape(value, [])
    axis = axis % ndim
    if not block_size:
        if len(shape) != 1:
            raise ValueError(f"scale/zero point of shape {shape} needs block_size (or must be 1-D)")
        return _per_channel(bb, value, axis, ndim)
    if len(shape) != ndim:
        raise ValueError(f"blocked quantization: scale/zero point has rank {len(shape)}, "
                         f"input has rank {ndim}")
    value = relax.op.repeat(value, int(block_size), axis=axis)
    x_len = _static_shape(bb, x)[axis]
    rep_len = _static_shape(bb, value)[axis]
    if not isinstance(x_len, int) or not isinstance(rep_len, int):
        raise ValueError("blocked quantization along a symbolic dimension is not supported")
    if rep_len < x_len:
        raise ValueError(f"blocked quantization: {shape[axis]} blocks of {block_size} do not "
                         f"cover dimension {axis} of size {x_len}")
    if rep_len != x_len:  # the last block is shorter
        value = relax.op.strided_slice(value, axes=[axis], begin=[0], end=[x_len])
    return value


def _wider_float(a: str, b: str) -> str:
    order = ["float16", "bfloat16", "float32", "float64"]
    if a == b:
        return a
    return max((a, b), key=lambda d: order.index(d) if d in order else -1)


def _narrow_or_blocked(types, attr) -> bool:
    from ..narrow_types import by_onnx

    return bool(attr.get("block_size", 0)) or any(by_onnx(t) for t in types[0] + types[1])


def _quantize(bb, inputs, attr, types):
    from tvm import relax

    from ..narrow_types import by_onnx
    from .narrow import decode, encode_float, onnx_dtype_name, require_zero

    x, scale, zp = (list(inputs) + [None, None])[:3]
    axis, block = attr.get("axis", 1), attr.get("block_size", 0)
    declared = attr.get("output_dtype", 0)
    if declared and types[1][0] and declared != types[1][0]:
        raise ValueError(f"output_dtype={declared} contradicts the output's declared type "
                         f"{types[1][0]}")
    out_type = types[1][0] or declared or \
        (types[0][2] if len(types[0]) > 2 else 0) or 2  # default uint8
    precision = attr.get("precision", 0)
    if precision:
        pdt = onnx_dtype_name(precision)
        x, scale = relax.op.astype(x, pdt), relax.op.astype(scale, pdt)
    else:
        compute = _wider_float(_dtype(bb, x), _dtype(bb, scale))
        x, scale = relax.op.astype(x, compute), relax.op.astype(scale, compute)
    q = relax.op.divide(x, _broadcast_param(bb, scale, x, axis, block))
    t = by_onnx(out_type)
    out_name = onnx_dtype_name(out_type)
    if t is None or not t.is_float:
        lo, hi = t.int_range if t else _INT_RANGES.get(out_name, (None, None))
        if lo is None:
            raise ValueError(f"QuantizeLinear to {out_name} is not supported")
        qf = relax.op.round(q)  # round half to even, as np.rint
        if _dtype(bb, qf) in ("float16", "bfloat16"):  # exact integers up to 2^24 for the zp add
            qf = relax.op.astype(qf, "float32")
        if zp is not None:
            qf = bb.normalize(relax.op.add(qf, relax.op.astype(
                _broadcast_param(bb, zp, x, axis, block), _dtype(bb, qf))))
        return _saturate(bb, qf, lo, hi, t.carrier if t else out_name)
    if t.name.startswith("float8"):  # the reference ignores the (zero) float8 zero point
        if zp is not None:
            require_zero(zp, t, "QuantizeLinear")
        return encode_float(bb, q, t, bool(attr.get("saturate", 1)))
    if zp is not None:  # float4/float6: no inf/NaN, so the cast saturates anyway
        zpf = decode(bb, _broadcast_param(bb, zp, x, axis, block), t, "float32")
        q = relax.op.add(relax.op.astype(q, "float32"), zpf)
    return encode_float(bb, q, t, True)


def _dequantize(bb, inputs, attr, types):
    from tvm import relax

    from ..narrow_types import by_onnx
    from .narrow import decode, onnx_dtype_name, require_zero

    x, scale, zp = (list(inputs) + [None, None])[:3]
    axis, block = attr.get("axis", 1), attr.get("block_size", 0)
    t = by_onnx(types[0][0])
    if t is not None and t.is_float:
        if zp is not None and t.name.startswith("float8"):
            require_zero(zp, t, "DequantizeLinear")
        dx = decode(bb, x, t, "float32")  # float8 zero points are zero; float4's are ignored
    else:
        dx = relax.op.astype(x, "float32")
        if zp is not None:
            dx = relax.op.subtract(dx, relax.op.astype(_broadcast_param(bb, zp, x, axis, block),
                                                       "float32"))
    y = relax.op.multiply(dx, relax.op.astype(_broadcast_param(bb, scale, x, axis, block),
                                              "float32"))
    out = onnx_dtype_name(attr.get("output_dtype", 0)) or _dtype(bb, scale)
    return relax.op.astype(y, out)


@register("QuantizeLinear")
def quantize_linear(bb, inputs, attr, params, opset):
    from .narrow import onnx_types

    types = onnx_types(attr, inputs, "QuantizeLinear")
    # TVM's converter takes the type from the zero point alone and would drop output_dtype
    if types is not None and (_narrow_or_blocked(types, attr) or attr.get("output_dtype", 0)):
        return _quantize(bb, inputs, attr, types)
    return tvm_converter("QuantizeLinear", opset)(bb, inputs, attr, params)


@register("DequantizeLinear")
def dequantize_linear(bb, inputs, attr, params, opset):
    from .narrow import onnx_types

    types = onnx_types(attr, inputs, "DequantizeLinear")
    if types is not None and _narrow_or_blocked(types, attr):
        return _dequantize(bb, inputs, attr, types)
    return tvm_converter("DequantizeLinear", opset)(bb, inputs, attr, params)
