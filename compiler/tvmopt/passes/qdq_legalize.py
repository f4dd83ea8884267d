"""relax.quantize legalized with NaN sent to the type's minimum, as onnxruntime and OpenVINO do.

TVM's legalization (`relax/transform/legalize_ops/qdq.py`) computes
`cast(max(min(round(x / scale) + zp, hi), lo))`. A NaN passes through min/max (TIR's min/max are
not NaN-aware), and the float -> int cast of a NaN is undefined: LLVM's fptoui gives poison, on
x86 it came out as 255 for uint8. ONNX's spec leaves NaN undefined for integer QuantizeLinear,
but every runtime tvmopt is checked against agrees: onnxruntime (MLAS, scalar and vector paths),
OpenVINO and onnx.reference all give the type's minimum (0 for uint8, -128 for int8), whatever
the zero point; +-inf saturate to the type's maximum / minimum.

NaNs do reach QuantizeLinear in real exports: onnxruntime's `quantize_static` of a GPT-2-style
decoder calibrates the causal-mask `Where` (which outputs -inf) to scale = inf, so
`x / scale` is 0 or NaN (-inf / inf), the dequantized scores and Softmax are NaN, and the
softmax's QuantizeLinear must turn those NaNs into 0 (what onnxruntime computes). With
TVM's legalization they became 255 -> probability 1.0 everywhere, and the model's output
differed from onnxruntime by 0.61 of its range.
"""

from __future__ import annotations

import tvm
from tvm import te, tirx
from tvm.relax.transform.legalize_ops.common import _try_convert_to_scalar_const


def _nan_safe_clip_cast(val, dtype: str):
    # max before min: TIR's max/min compile to a select on an ordered comparison, which is
    # false for NaN, so max(NaN, lo) is lo and the clip then keeps it (TVM's min-then-max order
    # turned NaN into hi). `val` appears once: an isnan(val) test beside the clip doubled the
    # expression at every quantize inlined into the next, and back-to-back QDQ pairs made
    # scheduling a fused kernel exponential.
    lo, hi = tvm.tirx.min_value(dtype), tvm.tirx.max_value(dtype)
    if str(val.ty).startswith(("float", "bfloat")):
        lo, hi = lo.astype(str(val.ty)), hi.astype(str(val.ty))
    return te.min(te.max(val, lo), hi).astype(dtype)


def _param(p, indices, axis):
    if isinstance(p, tirx.IntImm | tirx.FloatImm):
        return p
    if len(p.shape) == 0 or all(isinstance(d, tirx.IntImm) and d.value == 1 for d in p.shape):
        return p[(0,) * len(p.shape)]
    return p[indices[axis]]


def legalize_quantize(bb, call):
    """TVM's relax.quantize legalization, except that NaN becomes the minimum of out_dtype."""
    axis, out_dtype = call.attrs.axis, str(call.attrs.out_dtype)
    if "int" not in out_dtype:  # float8 outputs: TVM's own (its cast maps NaN to NaN)
        return tvm.ir.Op.get("relax.quantize").get_attr("FLegalize")(bb, call)

    def te_quantize(data, scale, zp):
        def compute(*indices):
            scaled = data[indices] / _param(scale, indices, axis)
            return _nan_safe_clip_cast(te.round(scaled) + _param(zp, indices, axis), out_dtype)

        return te.compute(data.shape, compute, name="quantized")

    return bb.call_te(te_quantize, call.args[0], _try_convert_to_scalar_const(call.args[1]),
                      _try_convert_to_scalar_const(call.args[2]), primfunc_name_hint="quantize")


def legalize_map() -> dict:
    """Op name -> legalization, for every `LegalizeOps(customize_legalize_map=)` of the pipeline."""
    return {"relax.quantize": legalize_quantize}
