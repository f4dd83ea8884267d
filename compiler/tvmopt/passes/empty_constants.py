"""A Relax pass that turns zero-element constants into run-time allocations.

TVM 0.27 exports a constant with no elements (a (2, 4, 0) state buffer, an empty initializer)
into the library's constant pool, but its loader refuses it when the library is loaded again
("Invalid DLTensor file format": it reads the zero data bytes as a failed read). An empty tensor
has no data to keep, so the constant becomes an `alloc_tensor` of its shape and dtype. Runs
after the last constant folding (which would fold it back) and before memory planning.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .mutate import rewrite_functions


def _is_empty_constant(expr) -> bool:
    """A tensor constant (TVM 0.27: `ir.GenericConst` holding a tensor) with no elements."""
    if not isinstance(expr, tvm.ir.expr.GenericConst):
        return False
    shape = getattr(expr.value, "shape", None)
    return shape is not None and 0 in tuple(shape)


@mutator
class _Replace(PyExprMutator):
    def visit_generic_const_(self, op):
        if not _is_empty_constant(op):
            return op
        shape = relax.ShapeExpr([int(d) for d in op.value.shape])
        return self.builder_.emit(relax.op.builtin.alloc_tensor(shape, str(op.value.dtype), 0))


def _has_empty_constant(func) -> bool:
    found = []
    relax.analysis.post_order_visit(func, lambda e: found.append(_is_empty_constant(e)))
    return any(found)


@tvm.transform.module_pass(opt_level=0, name="tvmopt.EmptyConstantsToAllocs")
def EmptyConstantsToAllocs(mod, _ctx):  # noqa: N802 - named like the TVM passes beside it
    """Replace every zero-element constant in the module's Relax functions."""
    return rewrite_functions(_Replace(mod), mod, only=_has_empty_constant)
