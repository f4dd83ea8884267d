"""Reading values out of Relax expressions: a constant's array, a scalar's value, a float32
tensor's dims. Shared by the rewrites (passes/), the default schedules' layout (codegen/) and the
library lowering (library/)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


def const_array(e) -> np.ndarray | None:
    """Value of a tensor constant (TVM 0.27 spells it GenericConst with a Tensor .value)."""
    if isinstance(e, tvm.ir.expr.Constant) and isinstance(getattr(e, "value", None),
                                                          tvm.runtime.Tensor):
        return e.value.numpy()
    return None


def scalar_value(e) -> float | None:
    """The value of a one-element tensor constant or of a scalar (R.clip's bounds), else
    None."""
    arr = const_array(e)
    if arr is not None:
        return float(arr.reshape(())) if arr.size == 1 else None
    # R.prim_value(...) is an IntImm/FloatImm expression in 0.27.
    if isinstance(e, tvm.ir.expr.Constant) and isinstance(getattr(e, "value", None),
                                                          (int, float)):
        return float(e.value)
    return None


def f32_shape(expr) -> list | None:
    """A float32 tensor's dims: ints where static, the PrimExpr where symbolic; None when the
    rank is unknown or the tensor is not float32."""
    sinfo = expr.ty
    if not isinstance(sinfo, relax.TensorType) or sinfo.dtype != "float32":
        return None
    if sinfo.shape is None or not isinstance(sinfo.shape, relax.ShapeExpr):
        return None
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in sinfo.shape.values]


def static_f32_shape(expr) -> list[int] | None:
    dims = f32_shape(expr)
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return dims
