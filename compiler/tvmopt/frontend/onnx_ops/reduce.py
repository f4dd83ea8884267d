"""CumSum/CumProd through TOPI (relax.op.cumsum/cumprod are not legalized for llvm here; CumProd
is missing from TVM's map), LpNormalization, which TVM's map lacks, and ReduceLogSumExp. The scans
and ReduceLogSumExp are registered in run_time_operands.py, which wraps them to add run-time
axes."""

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


@register("LpNormalization")
def lp_normalization(bb, inputs, attr, params, opset):
    """x / ||x||_p along `axis` (p = 1 or 2); a zero norm gives 0."""
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


def _reduce_axes(inputs, attr, rank: int):
    """Constant reduction axes from the attribute (opset < 18) or the input; None = identity."""
    import tvm

    axes = attr.get("axes")
    if len(inputs) > 1 and inputs[1] is not None:
        if not isinstance(inputs[1], tvm.ir.GenericConst):
            raise ValueError("only constant reduction axes are supported (given at run time)")
        axes = inputs[1].value.numpy().reshape(-1).tolist()
    if not axes:
        if attr.get("noop_with_empty_axes", 0):
            return None
        return list(range(rank))
    return sorted(a + rank if a < 0 else a for a in axes)


def reduce_log_sum_exp(bb, inputs, attr, params, opset):
    """log(sum(exp(x))) shifted by the max, in the input dtype (TVM's failed for float64)."""
    import numpy as np
    from tvm import relax

    x = inputs[0]
    axes = _reduce_axes(inputs, attr, x.ty.ndim)
    if axes is None:
        return x
    dtype = str(x.ty.dtype)
    keep = bool(attr.get("keepdims", 1))
    m = bb.normalize(relax.op.max(x, axes, keepdims=True))
    neg_inf = relax.const(np.array(-np.inf, dtype=dtype), dtype)
    # An all -inf (or empty) slice would give -inf - -inf = NaN; shift it by 0 instead.
    m = bb.normalize(relax.op.where(relax.op.equal(m, neg_inf), relax.op.zeros_like(m), m))
    s = relax.op.sum(relax.op.exp(relax.op.subtract(x, m)), axes, keepdims=True)
    out = bb.normalize(relax.op.add(relax.op.log(s), m))
    return relax.op.squeeze(out, axes) if not keep else out
