"""A Relax pass that turns `power(x, c)` with a small constant exponent into multiplies.

Legalized, `R.power` becomes one libm `powf` call per element, which LLVM cannot vectorize.
GPT-2's tanh GELU computes `x ** 3` on every activation (HF `NewGELUActivation`,
`torch.pow(x, 3.0)`, exported as ONNX Pow with a constant exponent), so that call sits in the
hottest elementwise kernel of the model. Multiplies vectorize and fuse with their neighbours.

The rewrites, and why each is exact enough for float32:
- 1 -> x, 0 -> ones (pow(x, 0) is 1 even for NaN): exact.
- 2 -> x*x: one rounding, as good as powf.
- 3 -> x*x*x, 4 -> (x*x)*(x*x): two roundings, within about 1 ulp of the true power.
- 0.5 -> sqrt(x): sqrt is correctly rounded (powf is not always). It differs from pow only at
  -0 (sqrt gives -0) and -inf (sqrt gives NaN, pow +inf).
- -1 -> 1/x: the division is correctly rounded, which is what pow(x, -1) approximates.
Other exponents (and anything that is not one scalar constant) keep `R.power`. The rewrite does
not depend on the shape of x, so it applies to symbolic shapes as to static ones.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .mutate import rewrite_functions

# Exponents with a rewrite; floats only for those that need a float result.
_FLOAT_ONLY = {0.5, -1.0}
_EXPONENTS = {0.0, 1.0, 2.0, 3.0, 4.0} | _FLOAT_ONLY


def _scalar_exponent(expr, x_ndim: int):
    """The exponent's value when it is a one-element constant that cannot broadcast x to a
    larger shape, else None."""
    if not isinstance(expr, tvm.ir.GenericConst):
        return None
    value = expr.value.numpy()
    if value.size != 1 or value.ndim > x_ndim:
        return None
    return float(value.reshape(()))


@mutator
class _PowerToMultiply(PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.power"):
            return call
        x, exp = call.args
        if isinstance(exp, relax.Var):
            bound = self.lookup_binding(exp)
            exp = bound if bound is not None else exp
        x_ty, out_ty = x.ty, call.ty
        if not (isinstance(x_ty, relax.TensorType) and
                isinstance(out_ty, relax.TensorType)) or x_ty.ndim < 0:
            return call
        dtype = str(x_ty.dtype)
        if dtype != str(out_ty.dtype):
            return call
        c = _scalar_exponent(exp, x_ty.ndim)
        is_float = dtype.startswith(("float", "bfloat"))
        if c is None or c not in _EXPONENTS or (c in _FLOAT_ONLY and not is_float):
            return call
        if c == 0.0:
            return relax.op.ones_like(x)
        if c == 1.0:
            return x
        if c == 0.5:
            return relax.op.sqrt(x)
        if c == -1.0:
            return relax.op.divide(relax.const(np.array(1, dtype=dtype), dtype), x)
        if c == 2.0:
            return relax.op.multiply(x, x)
        sq = self.builder_.emit(relax.op.multiply(x, x))
        return relax.op.multiply(sq, x) if c == 3.0 else relax.op.multiply(sq, sq)


@tvm.transform.module_pass(opt_level=0, name="tvmopt.PowerToMultiply")
def PowerToMultiply(mod, _ctx):  # noqa: N802 - named like the TVM passes beside it
    """Rewrite `power(x, c)` for c in {0, 1, 2, 3, 4, 0.5, -1} without pow (see the module doc)."""
    return rewrite_functions(_PowerToMultiply(mod), mod)
