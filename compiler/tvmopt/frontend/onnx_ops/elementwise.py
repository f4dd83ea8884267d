"""Elementwise ops whose TVM converters miss dtypes, attributes or edge values: Pow (mixed
types), Celu, Elu, IsInf, Mod, BitShift, Softplus, Mish."""

from __future__ import annotations

from . import register, tvm_converter



@register("Pow")
def pow(bb, inputs, attr, params, opset):
    from tvm import relax

    x, y = inputs[0], inputs[1]
    xt, yt = getattr(x, "ty", None), getattr(y, "ty", None)
    if not (isinstance(xt, relax.TensorType) and isinstance(yt, relax.TensorType)):
        return tvm_converter("Pow", opset)(bb, inputs, attr, params)
    xd, yd = str(xt.dtype), str(yt.dtype)
    if xd == yd and "float" in xd:
        return relax.op.power(x, y)
    # Integer bases are computed in float64 (exact for the integer range that does not
    # overflow the result type) and cast back; the result has the base's type.
    work = xd if "float" in xd else "float64"
    xw = x if xd == work else relax.op.astype(x, work)
    yw = y if yd == work else relax.op.astype(y, work)
    out = relax.op.power(xw, yw)
    return out if work == xd else relax.op.astype(out, xd)


def _const(value, dtype: str):
    import numpy as np
    from tvm import relax

    if dtype == "bfloat16":  # numpy has no bfloat16 scalar: build it in float32, cast in the graph
        return relax.op.astype(relax.const(np.array(value, dtype="float32")), dtype)
    return relax.const(np.array(value, dtype=dtype), dtype)


@register("Celu")
def celu(bb, inputs, attr, params, opset):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)) in x's dtype (TVM's mixed in a float32
    constant and failed for float16/bfloat16)."""
    from tvm import relax

    x = inputs[0]
    dtype = str(x.ty.dtype)
    alpha = _const(float(attr.get("alpha", 1.0)), dtype)
    zero, one = _const(0.0, dtype), _const(1.0, dtype)
    neg = relax.op.multiply(alpha, relax.op.subtract(
        relax.op.exp(relax.op.divide(x, alpha)), one))
    return relax.op.add(relax.op.maximum(x, zero), relax.op.minimum(neg, zero))


@register("IsInf")
def is_inf(bb, inputs, attr, params, opset):
    """Honours detect_positive / detect_negative (TVM's ignored both)."""
    import numpy as np
    from tvm import relax

    x = inputs[0]
    dtype = str(x.ty.dtype)
    pos, neg = attr.get("detect_positive", 1), attr.get("detect_negative", 1)
    hits = []
    if pos:
        hits.append(relax.op.equal(x, _const(np.inf, dtype)))
    if neg:
        hits.append(relax.op.equal(x, _const(-np.inf, dtype)))
    if not hits:
        return relax.op.zeros(x.ty.shape, "bool")
    return hits[0] if len(hits) == 1 else relax.op.logical_or(*hits)


@register("Mod")
class Mod:
    """Float Mod with fmod=0 as numpy's mod (fmod, then moved to the divisor's sign): TVM's
    a - floor(a / b) * b gave NaN for an infinite divisor. Everything else: TVM's."""

    @classmethod
    def get_converter(cls, opset):
        base = tvm_converter("Mod", opset)

        def convert(bb, inputs, attr, params):
            from tvm import relax

            a, b = inputs[0], inputs[1]
            dtype = str(getattr(a.ty, "dtype", ""))
            if attr.get("fmod", 0) or "float" not in dtype:
                return base(bb, inputs, attr, params)
            zero = _const(0.0, dtype)
            m = bb.normalize(relax.op.mod(a, b))  # truncated: C's fmod
            flip = relax.op.logical_and(relax.op.not_equal(m, zero), relax.op.logical_xor(
                relax.op.less(m, zero), relax.op.less(b, zero)))
            return relax.op.where(flip, relax.op.add(m, b), m)

        return convert


@register("BitShift")
def bit_shift(bb, inputs, attr, params, opset):
    """Shift amounts outside [0, bit width) give 0 (or -1 for a right shift of a negative
    signed value), as the reference; LLVM's shifts are undefined there."""
    import numpy as np
    from tvm import relax

    a, b = inputs[0], inputs[1]
    dtype = str(a.ty.dtype)
    bits = np.iinfo(dtype).bits
    direction = attr.get("direction", b"LEFT")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    if b.ty.dtype != a.ty.dtype:
        b = relax.op.astype(b, dtype)
    zero = relax.const(np.array(0, dtype=dtype), dtype)
    valid = relax.op.logical_and(
        relax.op.greater_equal(b, zero),
        relax.op.less(b, relax.const(np.array(bits, dtype=dtype), dtype)))
    safe_b = bb.normalize(relax.op.where(valid, b, zero))
    if direction == "LEFT":
        shifted, fill = relax.op.left_shift(a, safe_b), zero
    else:
        shifted = relax.op.right_shift(a, safe_b)
        fill = zero
        if np.issubdtype(np.dtype(dtype), np.signedinteger):
            fill = relax.op.where(relax.op.less(a, zero),
                                  relax.const(np.array(-1, dtype=dtype), dtype), zero)
    return relax.op.where(valid, shifted, fill)


def _softplus(x):
    """log(1 + exp(x)) without overflow for large x or underflow to 0 for very negative x:
    max(x, 0) + log1p(exp(-|x|)), log1p(e) by its series where log(1 + e) would round."""
    from tvm import relax

    dtype = str(x.ty.dtype)
    e = relax.op.exp(relax.op.negative(relax.op.abs(x)))
    series = relax.op.multiply(e, relax.op.subtract(_const(1.0, dtype),
                                                    relax.op.multiply(e, _const(0.5, dtype))))
    log1p = relax.op.where(relax.op.less(e, _const(1e-4, dtype)), series,
                           relax.op.log(relax.op.add(e, _const(1.0, dtype))))
    return relax.op.add(relax.op.maximum(x, _const(0.0, dtype)), log1p)


@register("Softplus")
def softplus(bb, inputs, attr, params, opset):
    return _softplus(inputs[0])


@register("Mish")
def mish(bb, inputs, attr, params, opset):
    """x * tanh(softplus(x)) with the stable softplus above (TVM's lost the tiny values of
    very negative x)."""
    from tvm import relax

    x = inputs[0]
    dtype = str(x.ty.dtype)
    sp = bb.normalize(_softplus(x))
    # TVM's tanh loses small arguments (its rational fit flushes ~1e-7 to ~0.7e-7);
    # below 1e-3, s - s^3/3 is tanh to float64 precision.
    small = relax.op.multiply(sp, relax.op.subtract(
        _const(1.0, dtype), relax.op.divide(relax.op.multiply(sp, sp), _const(3.0, dtype))))
    t = relax.op.where(relax.op.less(sp, _const(1e-3, dtype)), small, relax.op.tanh(sp))
    return relax.op.multiply(x, t)


@register("Elu")
def elu(bb, inputs, attr, params, opset):
    """x > 0 ? x : alpha * (exp(x) - 1), in x's dtype (TVM's failed for float16/bfloat16)."""
    from tvm import relax

    x = inputs[0]
    dtype = str(x.ty.dtype)
    alpha = _const(float(attr.get("alpha", 1.0)), dtype)
    zero, one = _const(0.0, dtype), _const(1.0, dtype)
    neg = relax.op.multiply(relax.op.subtract(
        relax.op.exp(relax.op.minimum(x, zero)), one), alpha)
    return relax.op.add(relax.op.maximum(x, zero), neg)
