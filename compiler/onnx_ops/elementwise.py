"""Pow with mixed base/exponent types (ONNX allows them; TVM requires one float dtype)."""

from __future__ import annotations

from . import register


def _tvm_converter(op_type: str):
    from tvm.relax.frontend.onnx import onnx_frontend

    return onnx_frontend._get_convert_map()[op_type]


@register("Pow")
class Pow:
    @classmethod
    def get_converter(cls, opset):
        def convert(bb, inputs, attr, params):
            from tvm import relax

            x, y = inputs[0], inputs[1]
            xt, yt = getattr(x, "ty", None), getattr(y, "ty", None)
            if not (isinstance(xt, relax.TensorType) and isinstance(yt, relax.TensorType)):
                return _tvm_converter("Pow").get_converter(opset)(bb, inputs, attr, params)
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

        return convert
