"""Vectorizable forms of exp, erf, tanh, softmax, sigmoid and GELU, chosen at legalization.

Legalized, these ops call scalar libm (expf, erff) per element, which LLVM cannot vectorize:
8192 floats on one core took erf 192 us vs fast_erf 2.5 us, exp 17 us vs fast_exp 2.6 us.
TOPI's fast_* are vectorizable polynomials for float32 (other dtypes keep the exact op), the
kind onnxruntime's MLAS uses too. TVM's FastMathTransform leaves sigmoid out, and SiLU/swish
(x * sigmoid(x): EfficientNet, YOLO, LLaMA's MLP) then runs one expf call per element: here it
is 1 / (1 + fast_exp(-x)).

Why a legalization and not TVM's FastMathTransform (a Relax pass of call_te calls): on symbolic
shapes LegalizeOps re-derives every tensor's shape through TOPI, which writes a broadcast of two
dims it cannot prove equal as `max(a, b)` (an exported BERT's `seq` becomes
`max(max(seq, max(seq, 0)), seq)` after `arange` and a broadcast add). A fast kernel built
earlier from the Relax type `(batch, seq)` then reads the buffer its producer writes as
`(batch, max(...))`, and FuseTIR refuses the pair ("Inconsistent buffers ... mapped to the same
relax var"). Building the fast kernels inside the same LegalizeOps builds them from the same
shapes as their neighbours, static or symbolic.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, topi


def fast_sigmoid(x):
    """TE sigmoid through fast_exp; fast_exp clamps its argument, so no overflow to inf."""
    one = tvm.tirx.const(1, x.dtype)
    return topi.divide(one, topi.add(one, topi.fast_exp(topi.negative(x))))


def fast_gelu(x):
    """x * 0.5 * (1 + erf(x / sqrt(2))) through fast_erf (GELU as one op: passes.gelu)."""
    half = tvm.tirx.const(0.5, x.dtype)
    one = tvm.tirx.const(1, x.dtype)
    erf = topi.fast_erf(topi.multiply(x, tvm.tirx.const(0.7071067811865476, x.dtype)))
    return topi.multiply(topi.multiply(x, half), topi.add(one, erf))


def fast_gelu_tanh(x):
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) through fast_tanh."""
    half = tvm.tirx.const(0.5, x.dtype)
    one = tvm.tirx.const(1, x.dtype)
    cube = topi.multiply(topi.multiply(x, x), x)
    inner = topi.add(x, topi.multiply(cube, tvm.tirx.const(0.044715, x.dtype)))
    t = topi.fast_tanh(topi.multiply(inner, tvm.tirx.const(0.7978845608028654, x.dtype)))
    return topi.multiply(topi.multiply(x, half), topi.add(one, t))


# Rows are padded to a whole number of this many floats: the widest float32 vector (AVX-512),
# so narrower ones divide it too.
_ROW_QUANTUM = 16


def fast_softmax(x, axis: int):
    """topi's fast_softmax, over a row padded to whole vectors when the row is ragged.

    The CPU schedules sum a row as vectors of partial sums, which needs a row length that is a
    whole number of vectors (ViT's 197 tokens, most real sequence lengths are not); otherwise
    the row's exp and sums run one element at a time. The padding is -inf, which changes
    neither the maximum nor (exp of -inf is 0) the sum, and leaves a row of all -inf NaN as the
    exact op makes it; the padded columns are dropped at the end.
    """
    nd = len(x.shape)
    axis = axis % nd
    n = x.shape[axis]
    if axis != nd - 1 or (isinstance(n, tvm.tirx.IntImm) and (
            n.value % _ROW_QUANTUM == 0 or n.value < 2 * _ROW_QUANTUM)):
        return topi.nn.fast_softmax(x, axis)
    if isinstance(n, tvm.tirx.IntImm):
        extra = -n.value % _ROW_QUANTUM
    else:
        # a symbolic row (a dynamic sequence length) is padded up to whole vectors too
        q = tvm.tirx.const(_ROW_QUANTUM, "int64")
        extra = tvm.tirx.floordiv(n + q - 1, q) * q - n
    padded = topi.nn.pad(x, [0] * nd, [0] * (nd - 1) + [extra],
                         pad_value=tvm.tirx.const(float("-inf"), x.dtype), name="T_softmax_pad")
    y = topi.nn.fast_softmax(padded, axis)
    return te.compute(x.shape, lambda *i: y(*i), name="T_softmax_unpad")


def _fast(op_name: str, te_func, *attr_names: str):
    """A legalization of `op_name` to `te_func` for float32, the op's own for other dtypes."""
    default = tvm.ir.Op.get(op_name).get_attr("FLegalize")

    def legalize(bb, call):
        x = call.args[0]
        if str(x.ty.dtype) != "float32":
            return default(bb, call)
        attrs = [getattr(call.attrs, a) for a in attr_names]
        return bb.call_te(te_func, x, *attrs)

    return legalize


def fast_legalize_map() -> dict:
    """Op name -> legalization to its fast form, for `LegalizeOps(customize_legalize_map=)`."""
    return {"relax.exp": _fast("relax.exp", topi.fast_exp),
            "relax.erf": _fast("relax.erf", topi.fast_erf),
            "relax.tanh": _fast("relax.tanh", topi.fast_tanh),
            "relax.sigmoid": _fast("relax.sigmoid", fast_sigmoid),
            "relax.nn.gelu": _fast("relax.nn.gelu", fast_gelu),
            "relax.nn.gelu_tanh": _fast("relax.nn.gelu_tanh", fast_gelu_tanh),
            "relax.nn.softmax": _fast("relax.nn.softmax", fast_softmax, "axis")}


@tvm.transform.module_pass(opt_level=0, name="tvmopt.FastMath")
def FastMath(mod, _ctx):  # noqa: N802 - named like the TVM passes beside it
    """Legalize every op of the module, the fast-math ones to their fast forms.

    The fusion phase's own LegalizeOps then finds nothing left to legalize, so the pipeline's
    other custom legalizations (NaN-safe relax.quantize) must be applied here too.
    """
    from .qdq_legalize import legalize_map

    return relax.transform.LegalizeOps(
        customize_legalize_map={**legalize_map(), **fast_legalize_map()})(mod)
