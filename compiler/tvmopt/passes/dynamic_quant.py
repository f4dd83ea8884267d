"""Relax passes that drop the work a dynamic quantization does not need when its input cannot
be negative.

ONNX DynamicQuantizeLinear (onnxruntime's `quantize_dynamic`) quantizes an activation with a
range computed at run time: rmin = min(0, min(x)), rmax = max(0, max(x)), scale =
(rmax - rmin) / 255, zero point = round(clip(-rmin / scale, 0, 255)). TVM imports it as those
ops, so every quantized layer the default schedules build reads its input twice for the two
full reductions before it quantizes it, and carries a run-time zero point into its integer
convolution or matmul. In a CNN most such inputs come out of a ReLU or ReLU6, where that work is
known at compile time:

- min(0, min(x)) is 0 when every element of x is at least 0: the `min` reduction goes.
- The zero point is then 0: the quantizing kernel and the integer kernel's `q - zero_point`
  take the constant, and the subtraction goes.

Exactness: with rmin = 0 the zero point is round(clip(0 / scale, 0, 255)) = 0 for every scale
above 0. Scale 0 means x is all zeros: the imported graph divides 0 by 0 there and its result
does not depend on the zero point (every product is scaled by 0), so both forms give the
bias alone. Inputs that may be negative keep the graph as imported.

Which inputs cannot be negative is read from their producers (`_lower_bound`): ReLU, clip or
maximum with a bound of at least 0, sigmoid, exp and softmax, means and average pools of such
values, through layout, indexing and max-pooling ops.
Two passes, because the library dispatch sits between them: `DropNonNegativeMin` runs before
it, while the activations that bound an input are still ops (a oneDNN convolution takes its
ReLU6 in as a post-op); `ZeroPointZero` after it, since the dispatch's dynamic int8 patterns
read `q - zero_point` as imported (a oneDNN call computes its own range and zero point, so only
the layers left to the default schedules lose their subtraction).
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .values import const_array, scalar_value
from .mutate import rewrite_functions

# Ops whose output is at least 0 whatever their input.
_NON_NEGATIVE = {"relax.nn.relu", "relax.sigmoid", "relax.exp", "relax.nn.softmax",
                 "relax.abs", "relax.sqrt"}
# Ops whose output holds only values of their first input (moved, repeated or picked).
_SAME_VALUES = {"relax.permute_dims", "relax.reshape", "relax.expand_dims", "relax.squeeze",
                "relax.flatten", "relax.strided_slice", "relax.take", "relax.broadcast_to",
                "relax.nn.max_pool2d", "relax.nn.max_pool1d", "relax.nn.max_pool3d",
                "relax.max"}
# Means of their input's values, and averages that may count padding zeros in.
_AVERAGES = {"relax.mean"}
_ZERO_PADDED_AVERAGES = {"relax.nn.avg_pool1d", "relax.nn.avg_pool2d", "relax.nn.avg_pool3d",
                         "relax.nn.adaptive_avg_pool1d", "relax.nn.adaptive_avg_pool2d",
                         "relax.nn.adaptive_avg_pool3d"}
# Deep enough for the activation chains exporters write; a longer chain only loses the bound.
_MAX_DEPTH = 16


def _op_name(e) -> str | None:
    return e.op.name if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None


@mutator
class _DynamicQuantRange(PyExprMutator):
    def __init__(self, mod, zero_point: bool):
        super().__init__(mod)
        self.zero_point = zero_point
        self.changed = False

    def _value(self, e):
        """The expression bound to `e` when `e` is a variable with a binding, else `e`."""
        if isinstance(e, relax.Var):
            bound = self.lookup_binding(e)
            if bound is not None:
                return bound
        return e

    def _lower_bound(self, e, depth: int = 0) -> float:
        """A lower bound of every element of `e` that its producers prove, or -inf."""
        e = self._value(e)
        if depth > _MAX_DEPTH:
            return -math.inf
        arr = const_array(e)
        if arr is not None:
            if arr.size == 0 or arr.dtype.kind not in "fiu":
                return -math.inf
            low = float(arr.min())
            return -math.inf if math.isnan(low) else low
        name = _op_name(e)
        if name is None:
            return -math.inf
        if name in _NON_NEGATIVE:
            return 0.0
        if name in _SAME_VALUES:
            return self._lower_bound(e.args[0], depth + 1)
        if name in _AVERAGES:
            return self._lower_bound(e.args[0], depth + 1)
        if name in _ZERO_PADDED_AVERAGES:
            return min(self._lower_bound(e.args[0], depth + 1), 0.0)
        if name == "relax.maximum":
            return max(self._lower_bound(a, depth + 1) for a in e.args)
        if name == "relax.minimum":
            return min(self._lower_bound(a, depth + 1) for a in e.args)
        if name == "relax.clip":
            lo = scalar_value(e.args[1])
            inner = self._lower_bound(e.args[0], depth + 1)
            return inner if lo is None or math.isnan(lo) else max(lo, inner)
        return -math.inf

    def _is_zero(self, e) -> bool:
        value = scalar_value(self._value(e))
        return value is not None and value == 0.0

    def _full_min_of(self, e):
        """x when `e` is min(x) over every axis to a scalar, else None."""
        e = self._value(e)
        if _op_name(e) != "relax.min" or not isinstance(e.ty, relax.TensorType) or \
                e.ty.ndim != 0:
            return None
        return e.args[0]

    def _zero_point_is_zero(self, zp) -> bool:
        """zp is DynamicQuantizeLinear's round(clip(0 - rmin / scale, 0, 255)) with rmin the
        constant 0, or the constant 0 itself."""
        zp = self._value(zp)
        if self._is_zero(zp):
            return True
        chain = ("relax.astype", "relax.round", "relax.clip", "relax.subtract",
                 "relax.divide")
        for i, name in enumerate(chain):
            if _op_name(zp) != name:
                return False
            if name == "relax.clip" and (scalar_value(zp.args[1]) != 0.0 or
                                         scalar_value(zp.args[2]) != 255.0):
                return False
            if name == "relax.subtract":
                if not self._is_zero(zp.args[0]):
                    return False
                zp = self._value(zp.args[1])
            elif name == "relax.divide":
                return self._is_zero(zp.args[0])
            else:
                zp = self._value(zp.args[0])
        return False

    def _zero_like(self, call):
        dtype = str(call.ty.dtype)
        return relax.const(np.zeros((), dtype=dtype), dtype)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        name = _op_name(call)
        if name == "relax.minimum" and isinstance(call.ty, relax.TensorType) and \
                call.ty.ndim == 0:
            # min(c, min(x)) with every element of x at least c -> c
            for c, other in ((call.args[0], call.args[1]), (call.args[1], call.args[0])):
                bound, x = scalar_value(self._value(c)), self._full_min_of(other)
                if bound is not None and x is not None and self._lower_bound(x) >= bound:
                    self.changed = True
                    return relax.const(np.array(bound, dtype=str(call.ty.dtype)),
                                       str(call.ty.dtype))
        elif not self.zero_point:
            return call
        elif name == "relax.quantize" and not self._is_zero(call.args[2]) and \
                self._zero_point_is_zero(call.args[2]):
            zp = call.args[2]
            self.changed = True
            return relax.op.quantize(call.args[0], call.args[1], self._zero_like(zp),
                                     int(call.attrs.axis), str(call.attrs.out_dtype))
        elif name == "relax.subtract" and _op_name(self._value(call.args[1])) == \
                "relax.astype" and call.args[1].ty.ndim == 0 and \
                self._zero_point_is_zero(self._value(call.args[1]).args[0]):
            # q - astype(zero point): the integer kernel's input when the zero point is 0.
            # The value of q, not the variable: a binding of one variable to another is a
            # boundary FuseOps does not look through (the layout transposes around the
            # quantization would no longer fuse and cancel); the old binding goes as dead code.
            self.changed = True
            value = self._value(call.args[0])
            return value if isinstance(value, relax.Call) else call.args[0]
        return call


def _rewrite(mod, zero_point: bool):
    """The rewritten module with its dead bindings removed, or `mod` itself when nothing
    matched: a module without such a quantization is not re-normalized at all (re-deriving
    the types of run-time shapes can lose what a match_cast established)."""
    mutator_ = _DynamicQuantRange(mod, zero_point)
    new = rewrite_functions(mutator_, mod)
    if not mutator_.changed:
        return mod
    return relax.transform.DeadCodeElimination()(new)


@tvm.transform.module_pass(opt_level=0, name="tvmopt.DropNonNegativeMin")
def DropNonNegativeMin(mod, _ctx):  # noqa: N802 - named like the TVM passes beside it
    """min(c, min(x)) -> c where every element of x is at least c (see the module doc); the
    reductions left unused are removed."""
    return _rewrite(mod, zero_point=False)


@tvm.transform.module_pass(opt_level=0, name="tvmopt.ZeroPointZero")
def ZeroPointZero(mod, _ctx):  # noqa: N802
    """A dynamic quantization's zero point whose range starts at the constant 0 becomes the
    constant 0, and `q - 0` becomes q (see the module doc)."""
    return _rewrite(mod, zero_point=True)
