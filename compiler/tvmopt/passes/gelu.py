"""A Relax pass that finds GELU spelled out in elementwise ops and makes it one `R.nn.gelu` /
`R.nn.gelu_tanh` call.

Exporters write GELU as its formula: torch's legacy ONNX exporter (before opset 20's Gelu op)
emits `x * (erf(x / sqrt(2)) + 1) * 0.5`, Hugging Face's `gelu_new` (GPT-2) emits
`0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`. Spelled out, the formula is five
to nine kernels' worth of elementwise ops that no library pattern can see: a dense layer's
oneDNN call then writes its output, and a separate kernel reads it back for the GELU. As one
op it becomes the library call's GELU post-op (what onnxruntime's GELU fusion does), or one
fused elementwise kernel on the default schedules.

A product is recognised whatever the order and nesting of its factors, a division by a
constant counts as a multiplication by its inverse, and the constants must equal the
formula's to float32 precision; anything else is left alone. The rewrite replaces the final
product only: an intermediate with another use is still computed for it.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .mutate import rewrite_functions

_RTOL = 1e-5  # constants as exporters round them to float32
_INV_SQRT2 = 1 / math.sqrt(2)
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_CUBIC = 0.044715


def _scalar(expr) -> float | None:
    if isinstance(expr, tvm.ir.GenericConst):
        v = expr.value.numpy()
        if v.size == 1 and v.dtype.kind == "f":
            return float(v.reshape(()))
    return None


def _is_op(expr, name) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and \
        expr.op.name == name


def _close(v, ref) -> bool:
    return v is not None and abs(v - ref) <= _RTOL * abs(ref)


@mutator
class _FuseGelu(PyExprMutator):
    def _value(self, e):
        """What a dataflow var is bound to (through any chain of var-to-var bindings)."""
        while isinstance(e, relax.Var):
            bound = self.lookup_binding(e)
            if bound is None:
                return e
            e = bound
        return e

    def _factors(self, e, depth=0):
        """Leaves of a product tree: (non-constant factors as exprs, constant scale)."""
        v = self._value(e)
        if depth < 6 and _is_op(v, "relax.multiply"):
            fa, sa = self._factors(v.args[0], depth + 1)
            fb, sb = self._factors(v.args[1], depth + 1)
            return fa + fb, sa * sb
        if depth < 6 and _is_op(v, "relax.divide"):
            c = _scalar(self._value(v.args[1]))
            if c is not None and c != 0:
                f, s = self._factors(v.args[0], depth + 1)
                return f, s / c
        c = _scalar(v)
        if c is not None:
            return [], c
        return [e], 1.0

    def _same(self, a, b) -> bool:
        return a.same_as(b) or self._value(a).same_as(self._value(b))

    def _one_plus(self, e, op):
        """The argument of `op` in `op(arg) + 1` (either order), else None."""
        v = self._value(e)
        if not _is_op(v, "relax.add"):
            return None
        for a, b in ((v.args[0], v.args[1]), (v.args[1], v.args[0])):
            inner = self._value(a)
            if _close(_scalar(self._value(b)), 1.0) and _is_op(inner, op):
                return inner.args[0]
        return None

    def _is_scaled_x(self, e, x, scale) -> bool:
        factors, s = self._factors(e)
        return len(factors) == 1 and self._same(factors[0], x) and _close(s, scale)

    def _is_tanh_inner(self, e, x) -> bool:
        """sqrt(2/pi) * (x + 0.044715 * x^3), in any arrangement of the products."""
        factors, s = self._factors(e)
        if len(factors) != 1 or not _close(s, _SQRT_2_OVER_PI):
            return False
        v = self._value(factors[0])
        if not _is_op(v, "relax.add"):
            return False
        for a, b in ((v.args[0], v.args[1]), (v.args[1], v.args[0])):
            cube, c = self._factors(b)
            if self._same(a, x) and len(cube) == 3 and all(self._same(f, x) for f in cube) \
                    and _close(c, _CUBIC):
                return True
        return False

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not _is_op(call, "relax.multiply") or not isinstance(call.ty, relax.TensorType) or \
                not str(call.ty.dtype).startswith("float"):
            return call
        factors, s = self._factors(call)
        if len(factors) != 2 or not _close(s, 0.5):
            return call
        for x, other in ((factors[0], factors[1]), (factors[1], factors[0])):
            x_ty = x.ty
            if not isinstance(x_ty, relax.TensorType) or \
                    not tvm_ffi.structural.structural_equal(x_ty, call.ty):
                continue
            arg = self._one_plus(other, "relax.erf")
            if arg is not None and self._is_scaled_x(arg, x, _INV_SQRT2):
                return relax.op.nn.gelu(x)
            arg = self._one_plus(other, "relax.tanh")
            if arg is not None and self._is_tanh_inner(arg, x):
                return relax.op.nn.gelu_tanh(x)
        return call


@tvm.transform.module_pass(opt_level=0, name="tvmopt.FuseGelu")
def FuseGelu(mod, _ctx):  # noqa: N802 - named like the TVM passes beside it
    """Spelled-out erf / tanh GELU -> R.nn.gelu / R.nn.gelu_tanh (see the module doc)."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(_FuseGelu(mod), mod))

