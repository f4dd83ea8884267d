"""Int8 ops of quantized models: QLinearMatMul, QLinearConv, ConvInteger.

TVM 0.27's Relax frontend has none of them. Each is computed as the ONNX spec (and its reference
implementation) defines: widen to int32, subtract the zero points, accumulate in int32, then
requantize: multiply by `x_scale * w_scale / y_scale`, round half to even, add the output zero
point and saturate to the output type. Scales and zero points may be run-time tensors.
"""

from __future__ import annotations

from . import register


def _tvm_converter(op_type: str):
    from tvm.relax.frontend.onnx import onnx_frontend

    return onnx_frontend._get_convert_map()[op_type]


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
    return relax.op.astype(relax.op.clip(rounded, lo, hi), out_dtype)


def _multiplier(bb, x_scale, w_scale, y_scale):
    from tvm import relax

    return relax.op.divide(relax.op.multiply(x_scale, w_scale), y_scale)


def _conv_int32(bb, x, w, attr, opset):
    """Integer convolution through TVM's Conv converter (padding, auto_pad, 1-3 spatial dims)."""
    x, w = bb.normalize(x), bb.normalize(w)  # TVM's converter reads their shapes
    return _tvm_converter("Conv").get_converter(max(opset, 11))(bb, [x, w, None], dict(attr), None)


@register("QLinearMatMul")
class QLinearMatMul:
    @classmethod
    def get_converter(cls, opset):
        def convert(bb, inputs, attr, params):
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

        return convert


@register("ConvInteger")
class ConvInteger:
    @classmethod
    def get_converter(cls, opset):
        def convert(bb, inputs, attr, params):
            x, w, x_zp, w_zp = (list(inputs) + [None] * 4)[:4]
            return _conv_int32(bb, _widen(bb, x, x_zp), _widen(bb, w, w_zp, channel_axis=0),
                               attr, opset)

        return convert


@register("QLinearConv")
class QLinearConv:
    @classmethod
    def get_converter(cls, opset):
        def convert(bb, inputs, attr, params):
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

        return convert
