"""Ops whose output shape is a tensor fed at run time: the shape is checked before it becomes an
allocation (each dim >= 0, the element count within the compile's limit; see run_time_checks).
The ops that compute such shapes themselves check them where they bind them (`shape_vars`)."""

from __future__ import annotations

from . import register, tvm_converter
from .run_time_operands import is_run_time


@register("ConstantOfShape")
def constant_of_shape(bb, inputs, attr, params, opset):
    """ConstantOfShape, its run-time shape checked."""
    from tvm import relax

    from .. import run_time_checks

    shape = inputs[0]
    if isinstance(shape, relax.Expr) and isinstance(getattr(shape, "ty", None),
                                                    relax.TensorType) \
            and is_run_time(shape, params):
        list.__setitem__(inputs, 0, run_time_checks.checked_sizes(
            bb, shape, run_time_checks.site(0, "input")))
    return tvm_converter("ConstantOfShape", opset)(bb, inputs, attr, params)
