"""Gather/scatter ops whose indices come from the inputs: checked before they address memory.

TVM's converters lower these to kernels that read or write `data[index]` unchecked. Run-time
indices first pass `run_time_checks.checked_indices` (one pass: negatives normalized the ONNX
way, anything else out of range an error naming the node, the input, the value and the valid
range); constant indices are checked here, at compile time, and refused by name.
"""

from __future__ import annotations

from . import register, tvm_converter
from .run_time_operands import is_run_time


def _dims(data):
    """data's dims (ints or symbolic), or None when its rank is unknown."""
    from tvm import relax, tirx

    ty = getattr(data, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return [int(d) if isinstance(d, tirx.IntImm) else d for d in ty.shape.values]


def _bounds(op_type: str, attr, data, indices):
    """The dims each index coordinate addresses (one per coordinate), or None when unknown."""
    from ..run_time_checks import addressed_dims

    dims = _dims(data)
    if dims is None:
        return None
    if op_type in ("Gather", "GatherElements", "ScatterElements", "Scatter"):
        return addressed_dims(dims, axis=int(attr.get("axis", 0)))
    shape = indices.ty.shape
    coords = shape.values[-1] if indices.ty.ndim and shape is not None else None
    start = int(attr.get("batch_dims", 0)) if op_type == "GatherND" else 0
    return addressed_dims(dims, coords=coords, start=start)


def _make(op_type: str):
    class Checked:
        @classmethod
        def get_converter(cls, opset):
            if op_type == "Gather":
                import functools

                from .shape_values import gather

                base = functools.partial(gather, opset=opset)
            else:
                base = tvm_converter(op_type, opset)

            def convert(bb, inputs, attr, params):
                import tvm
                from tvm import relax
                from tvm.relax.frontend.onnx.onnx_frontend import get_constant

                from .. import run_time_checks

                from .shape_values import as_shape_tensor

                data, indices = inputs[0], inputs[1]
                if not isinstance(data, relax.Expr) or not isinstance(indices, relax.Expr) or \
                        not isinstance(indices.ty, relax.TensorType):
                    return base(bb, inputs, attr, params)  # shape arithmetic: TVM's cases
                if isinstance(data.ty, relax.ShapeType) and is_run_time(indices, params):
                    # a shape read at run-time positions: as the int64 tensor it is
                    data = as_shape_tensor(bb, data)
                    list.__setitem__(inputs, 0, data)
                const = get_constant(indices, params)
                bounds = _bounds(op_type, attr, data, indices)
                if isinstance(const, tvm.ir.GenericConst) and (bounds is None or all(
                        isinstance(b, int) for b in bounds)):
                    if bounds is not None:
                        # refused at compile time: the importer prefixes the node
                        value = run_time_checks.check_constant_indices(
                            const.value.numpy(), bounds, run_time_checks.operand_label(
                                1, "indices"))
                        dtype = str(const.value.numpy().dtype)
                        list.__setitem__(inputs, 1, relax.const(value.astype(dtype), dtype))
                    return base(bb, inputs, attr, params)
                # fed or computed at run time, or constant into a dim known only then
                where = run_time_checks.site(1, "indices")
                if bounds is None:
                    raise ValueError(f"{where}: the dims it indexes are unknown at compile time, "
                                     "so its indices cannot be checked")
                # set in place: the importer's record of which inputs the converter read stays
                list.__setitem__(inputs, 1, run_time_checks.checked_indices(bb, indices, bounds,
                                                                             where))
                return base(bb, inputs, attr, params)

            return convert

    Checked.__name__ = Checked.__qualname__ = op_type
    Checked.__doc__ = f"{op_type} with its indices checked (at run time where they are inputs)."
    return register(op_type)(Checked)


for _op in ("Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND", "Scatter"):
    _make(_op)
