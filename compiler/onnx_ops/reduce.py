"""CumSum/CumProd through TOPI (relax.op.cumsum/cumprod are not legalized for llvm here; CumProd
is missing from TVM's map) and LpNormalization, which TVM's map lacks."""

from __future__ import annotations

from . import register


def _scan(bb, inputs, attr, op_name: str):
    import tvm
    from tvm import topi

    data, axis = inputs[0], inputs[1]
    if not isinstance(axis, tvm.ir.GenericConst):
        raise ValueError(f"{op_name} needs a constant axis")
    axis = int(axis.value.numpy().reshape(-1)[0])
    fn = topi.cumsum if op_name == "CumSum" else topi.cumprod
    reverse = attr.get("reverse", 0) != 0
    if reverse:
        data = bb.emit_te(topi.flip, data, axis=axis)
    out = bb.emit_te(fn, data, axis, exclusive=attr.get("exclusive", 0) != 0)
    if reverse:
        out = bb.emit_te(topi.flip, out, axis=axis)
    return out


@register("CumSum")
class CumSum:
    """CumSum with a constant axis, reverse and exclusive."""

    @classmethod
    def get_converter(cls, opset):
        return lambda bb, inputs, attr, params: _scan(bb, inputs, attr, "CumSum")


@register("CumProd")
class CumProd:
    """CumProd with a constant axis, reverse and exclusive."""

    @classmethod
    def get_converter(cls, opset):
        return lambda bb, inputs, attr, params: _scan(bb, inputs, attr, "CumProd")


@register("LpNormalization")
class LpNormalization:
    """x / ||x||_p along `axis` (p = 1 or 2); a zero norm gives 0."""

    @classmethod
    def get_converter(cls, opset):
        return cls._convert

    @staticmethod
    def _convert(bb, inputs, attr, params):
        from tvm import relax

        x = inputs[0]
        axis, p = int(attr.get("axis", -1)), int(attr.get("p", 2))
        dtype = str(x.ty.dtype)
        if p == 1:
            norm = relax.op.sum(relax.op.abs(x), [axis], keepdims=True)
        elif p == 2:
            norm = relax.op.sqrt(relax.op.sum(relax.op.multiply(x, x), [axis], keepdims=True))
        else:
            raise ValueError(f"LpNormalization p={p}: only p=1 and p=2 are defined")
        norm = bb.normalize(norm)
        zero = relax.const(0, dtype)
        return relax.op.where(relax.op.equal(norm, zero), relax.op.zeros_like(x),
                              relax.op.divide(x, norm))
