"""Shape arithmetic that exporters emit around dynamic dims, kept symbolic.

TVM's importer carries `Shape(x)` as a `relax.ShapeExpr` and a single dim as a scalar
`PrimValue`, so `Reshape(x, Concat(Shape(x)[0:1], [-1]))` keeps the symbolic dim `batch`.
Exporters also emit patterns its converters do not expect: torch's dynamo exporter writes
`Reshape(Squeeze(Shape(x)) * 4, [1])` (a scalar dim reshaped to a 1-d shape) and
`Range(0, seq, 1)`, whose length TVM turns into a fresh unknown var, so `emb + pos_emb`
loses its shape. The converters here handle those cases symbolically and defer to TVM's
for everything else.
"""

from __future__ import annotations

from . import register


def _tvm_converter(op_type: str):
    from tvm.relax.frontend.onnx import onnx_frontend

    return onnx_frontend._get_convert_map()[op_type]


def prim_of(value):
    """The TIR expression of a scalar shape value (PrimValue or TIR expr), else None."""
    import tvm

    # TVM 0.27 unified the IRs: relax.prim_value(e) is the TIR expression e itself.
    return value if tvm.ir.is_prim_expr(value) else None


def const_ints(value):
    """A constant integer tensor as a Python list (0-d: int), else None."""
    import numpy as np
    import tvm

    if isinstance(value, tvm.ir.GenericConst):
        arr = value.value.numpy()
        if arr.dtype.kind in "iu":
            return arr.tolist()
    return None


def as_shape_tensor(bb, value):
    """Materialise a shape value (ShapeExpr, shape-typed var or scalar dim) as an int64 tensor."""
    from tvm import relax, tirx

    prim = prim_of(value)
    if prim is not None:
        if str(prim.ty) != "int64":
            prim = tirx.Cast("int64", prim)
        tensor = bb.normalize(relax.op.shape_to_tensor(relax.ShapeExpr([prim])))
        return bb.normalize(relax.op.reshape(tensor, ()))
    if isinstance(value, relax.Expr) and isinstance(value.ty, relax.ShapeType):
        return bb.normalize(relax.op.shape_to_tensor(value))
    return value


def _scalar_dim(value):
    """A Range/Reshape operand as a TIR int expression, when it is one (const or shape value)."""
    from tvm import tirx

    prim = prim_of(value)
    if prim is not None:
        if "int" not in str(prim.ty):
            return None
        return prim if str(prim.ty) == "int64" else tirx.Cast("int64", prim)
    ints = const_ints(value)
    if isinstance(ints, int):
        return tirx.IntImm("int64", ints)
    if isinstance(ints, list) and len(ints) == 1:
        return tirx.IntImm("int64", ints[0])
    return None


@register("Range")
class Range:
    """Integer Range over symbolic dims gets a symbolic length (e.g. `seq`), not a fresh var."""

    @classmethod
    def get_converter(cls, opset):
        return lambda bb, inputs, attr, params: cls._convert(bb, inputs, attr, params, opset)

    @classmethod
    def _convert(cls, bb, inputs, attr, params, opset):
        from tvm import relax, tirx
        from tvm.sym.analyzer import Analyzer

        start, limit, delta = (_scalar_dim(x) for x in inputs[:3])
        step = const_ints(inputs[2])
        step = step if isinstance(step, int) else (step[0] if isinstance(step, list) and
                                                   len(step) == 1 else None)
        dtype = _dtype_of(inputs[0])
        symbolic = any(prim_of(x) is not None for x in inputs[:3])
        if not symbolic or any(x is None for x in (start, limit, delta)) or not step or dtype is None \
                or "int" not in dtype:
            return _tvm_converter("Range").get_converter(opset)(bb, inputs, attr, params)
        analyzer = Analyzer()
        if step > 0:
            count = tirx.floordiv(limit - start + (step - 1), step)
        else:
            count = tirx.floordiv(start - limit + (-step - 1), -step)
        count = analyzer.simplify(tirx.max(count, tirx.IntImm("int64", 0)))
        out = relax.op.arange(0, count, 1, "int64")
        if step != 1:
            out = relax.op.multiply(out, relax.const(step, "int64"))
        if not (isinstance(start, tirx.IntImm) and start.value == 0):
            out = relax.op.add(out, as_shape_tensor(bb, start))
        if dtype != "int64":
            out = relax.op.astype(out, dtype)
        return out


def _dtype_of(value):
    from tvm import relax

    prim = prim_of(value)
    if prim is not None:
        return str(prim.ty)
    if isinstance(value, relax.Expr) and isinstance(value.ty, relax.TensorType):
        return str(value.ty.dtype)
    return None


@register("Reshape")
class Reshape:
    """A scalar dim reshaped to [1] / [-1] becomes a one-element ShapeExpr (and [] stays scalar)."""

    @classmethod
    def get_converter(cls, opset):
        def convert(bb, inputs, attr, params):
            from tvm import relax

            prim = prim_of(inputs[0])
            target = const_ints(inputs[1])
            if prim is not None and target is not None:
                if target in ([1], [-1]):
                    return relax.ShapeExpr([prim])
                if target == []:
                    return inputs[0]
            data = inputs[0]
            if isinstance(data, relax.Expr) and isinstance(data.ty, relax.ShapeType) \
                    and not isinstance(data, relax.ShapeExpr):
                data = as_shape_tensor(bb, data)
            if prim is not None:
                data = as_shape_tensor(bb, data)
            return _tvm_converter("Reshape").get_converter(opset)(
                bb, [data, *inputs[1:]], attr, params)

        return convert


@register("Gather")
class Gather:
    """Gather from a shape whose dims are unknown at import (a shape-typed var) reads it as a tensor."""

    @classmethod
    def get_converter(cls, opset):
        def convert(bb, inputs, attr, params):
            from tvm import relax

            data = inputs[0]
            if isinstance(data, relax.Expr) and isinstance(data.ty, relax.ShapeType) \
                    and not isinstance(data, relax.ShapeExpr):
                data = as_shape_tensor(bb, data)
            indices = inputs[1]
            if prim_of(indices) is not None:
                indices = as_shape_tensor(bb, indices)
            return _tvm_converter("Gather").get_converter(opset)(
                bb, [data, indices, *inputs[2:]], attr, params)

        return convert


def static_dims(value):
    """Dims of a constant int tensor or a ShapeExpr as TIR int64 exprs, else None."""
    from tvm import relax, tirx

    if isinstance(value, relax.ShapeExpr):
        return list(value.values)
    ints = const_ints(value)
    if isinstance(ints, list):
        return [tirx.IntImm("int64", int(v)) for v in ints]
    return None


def broadcast_dim(a, b):
    """ONNX (numpy) broadcast of two dims, symbolic allowed: equal dims or a 1 give max(a, b)."""
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    for x, y in ((a, b), (b, a)):
        if isinstance(x, tirx.IntImm) and x.value == 1:
            return y
    return Analyzer().simplify(tirx.max(a, b))


@register("Expand")
class Expand:
    """Expand of a symbolically shaped tensor to a constant or symbolic shape, by broadcast rules."""

    @classmethod
    def get_converter(cls, opset):
        def convert(bb, inputs, attr, params):
            from tvm import relax, tirx

            data, shape = inputs[0], inputs[1]
            target = static_dims(shape)
            ty = getattr(data, "ty", None)
            if target is None or not isinstance(ty, relax.TensorType) \
                    or not isinstance(ty.shape, relax.ShapeExpr):
                return _tvm_converter("Expand").get_converter(opset)(bb, inputs, attr, params)
            dims = list(ty.shape.values)
            rank = max(len(dims), len(target))
            one = tirx.IntImm("int64", 1)
            dims = [one] * (rank - len(dims)) + dims
            target = [one] * (rank - len(target)) + target
            out = []
            for d, t in zip(dims, target):
                if isinstance(t, tirx.IntImm) and t.value == -1:
                    out.append(d)  # TVM's reading of -1: keep the input dim
                else:
                    out.append(broadcast_dim(d, t))
            if len(dims) != len(ty.shape.values):
                data = relax.op.reshape(data, relax.ShapeExpr(dims))
            return relax.op.broadcast_to(data, relax.ShapeExpr(out))

        return convert
