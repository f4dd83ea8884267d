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

from contextlib import ExitStack

from .. import run_time_checks
from . import register, tvm_converter



def prim_of(value):
    """The TIR expression of a scalar shape value (PrimValue or TIR expr), else None."""
    import tvm

    # TVM 0.27 unified the IRs: relax.prim_value(e) is the TIR expression e itself.
    return value if tvm.ir.is_prim_expr(value) else None


def keep_scalar_dtype(result, inputs):
    """A binary op TVM folded in numpy on known scalars (`Cast(H) / 2.0` for an image height
    H) returns a Python number, which becomes a float64 (int64) scalar whatever the operands
    were: the next op then mixes float64 with the graph's float32 ("Binary operators must have
    the same datatype"). The folded value is given the operands' dtype back."""
    from tvm import tirx

    if not isinstance(result, (tirx.FloatImm, tirx.IntImm)):
        return result
    dtypes = set()
    for v in inputs:
        if v is None:
            continue
        dtype = getattr(getattr(v, "ty", None), "dtype", None)  # a scalar's or a tensor's
        if dtype is None:
            return result
        dtypes.add(str(dtype))
    if len(dtypes) != 1:
        return result
    (dtype,) = dtypes
    if dtype == str(result.ty.dtype) or dtype == "bool":
        return result
    return tirx.const(result.value, dtype)


def scalar_fold_operands(bb, inputs: list):
    """Operands of a binary arithmetic op (Add/Sub/Mul/Div) that TVM's converter would fold in
    numpy, a scalar dim beside constant arrays, made such that the result keeps the arrays'
    rank; with a function for the converter's result (None: use it as it is).

    TVM folds `[0] + past` (a decoder's query positions, `Range(0, seq) + past` with seq fixed
    at 1: Range folds to the constant `[0]`) to the scalar `past`, `.item()` dropping the 1-d
    array's rank, so the Unsqueezes after it see one rank less and fail ("Unsqueeze axis 3 is
    out of range for rank 3"); an array of more than one element fails in `.item()` itself.
    A 1-d int64 result of one element stays a shape value (`ShapeExpr([past])`, symbolic); any
    other is computed as a tensor of the broadcast shape, the dim fed in as a 0-d tensor.
    """
    import numpy as np
    import tvm
    from tvm import relax

    if not any(prim_of(v) is not None for v in inputs):
        return inputs, None
    arrays = [v for v in inputs if isinstance(v, tvm.ir.GenericConst) and v.ty.ndim > 0]
    if not arrays:
        return inputs, None  # scalars only: TVM's fold is right
    shape = np.broadcast_shapes(*[tuple(int(d) for d in v.value.numpy().shape) for v in arrays])
    dtypes = {str(v.ty.dtype) for v in arrays}
    prims = [prim_of(v) for v in inputs if prim_of(v) is not None]
    if shape == (1,) and dtypes == {"int64"} and all("int" in str(p.ty) for p in prims):
        scalars = [relax.const(v.value.numpy().reshape(()), "int64") if v in arrays else v
                   for v in inputs]

        def as_shape(result):
            prim = prim_of(result)
            if prim is None:
                return result
            if str(prim.ty) != "int64":
                from tvm import tirx

                prim = tirx.Cast("int64", prim)
            return relax.ShapeExpr([prim])

        return scalars, as_shape
    (dtype,) = dtypes if len(dtypes) == 1 else (None,)
    tensors = []
    for v in inputs:
        if prim_of(v) is not None:
            v = as_shape_tensor(bb, v)
            if dtype is not None and str(v.ty.dtype) != dtype:
                v = bb.normalize(relax.op.astype(v, dtype))
        tensors.append(v)
    return tensors, None


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
        if "float" in str(prim.ty):
            from tvm.sym.analyzer import Analyzer

            folded = Analyzer().simplify(prim)
            if isinstance(folded, tirx.FloatImm):  # a static dim's float arithmetic
                return relax.const(float(folded.value), str(prim.ty))
        if "float" in str(prim.ty) and isinstance(prim, tirx.Cast) \
                and "int" in str(prim.value.ty):
            # A dim cast to float (MobileViT's `float(h) * 2`): the dim as a tensor, then cast;
            # casting the float expression back to int64 would hand Mul an int64 operand.
            return bb.normalize(relax.op.astype(as_shape_tensor(bb, prim.value), str(prim.ty)))
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

        folded = _known_range(inputs[:3])
        if folded is not None:
            return folded
        start, limit, delta = (_scalar_dim(x) for x in inputs[:3])
        step = const_ints(inputs[2])
        step = step if isinstance(step, int) else (step[0] if isinstance(step, list) and
                                                   len(step) == 1 else None)
        dtype = _dtype_of(inputs[0])
        symbolic = any(prim_of(x) is not None for x in inputs[:3])
        if not symbolic or any(x is None for x in (start, limit, delta)) or not step or dtype is None \
                or "int" not in dtype:
            ranged = _run_time_range(bb, list(inputs[:3]))
            return ranged if ranged is not None else tvm_converter("Range", opset)(
                bb, inputs, attr, params)
        analyzer = Analyzer()
        if step > 0:
            count = tirx.floordiv(limit - start + (step - 1), step)
        else:
            count = tirx.floordiv(start - limit + (-step - 1), -step)
        count = tirx.max(count, tirx.IntImm("int64", 0))
        # The symbolic operands are dims, never negative: knowing so, `max(seq, 0)` is `seq`,
        # and the arange broadcasts against tensors of shape (.., seq, ..) without a
        # `max(seq, 0)` the matmul legalizer cannot match.
        with ExitStack() as scopes:
            for var in tirx.analysis.undefined_vars(count):
                scopes.enter_context(analyzer.constraint_scope(var >= 0))
            count = analyzer.simplify(count)
        out = relax.op.arange(0, count, 1, "int64")
        if step != 1:
            out = relax.op.multiply(out, relax.const(step, "int64"))
        if not (isinstance(start, tirx.IntImm) and start.value == 0):
            out = relax.op.add(out, as_shape_tensor(bb, start))
        if dtype != "int64":
            out = relax.op.astype(out, dtype)
        return out


def _run_time_range(bb, operands):
    """Range where start, limit or delta is a tensor fed or computed at run time (None where
    none is): its length ceil((limit - start) / delta) computed in float64 (integer
    operands far apart overflow int64 in the difference, which TVM's converter computes in their
    type and then allocates by; float64 rounds only counts of operands beyond 2^53), checked
    (delta not 0, the element count within the compile's limit) and bound to a symbolic dim;
    element i is start + i * delta in the operands' type."""
    from tvm import relax, te, tirx

    from .run_time_operands import shape_vars

    if not any(_is_tensor_var(v) for v in operands) or any(
            not isinstance(getattr(v, "ty", None), relax.TensorType) or v.ty.ndim not in (0, 1)
            for v in operands):
        return None
    dtype = str(operands[0].ty.dtype)
    s, lim, d = (bb.normalize(relax.op.astype(relax.op.reshape(v, [1]), "float64"))
                 for v in operands)
    zero = relax.const(0.0, "float64")
    nonzero = bb.normalize(relax.op.astype(relax.op.not_equal(d, zero), "int64"))
    nonzero = run_time_checks.checked_sizes(bb, nonzero, run_time_checks.site(2, "delta"),
                                            "nonzero")
    big = run_time_checks.max_elements() + 1
    safe = relax.op.where(relax.op.equal(d, zero), relax.const(1.0, "float64"), d)
    count = relax.op.ceil(relax.op.divide(relax.op.subtract(lim, s), safe))
    count = relax.op.clip(relax.op.maximum(count, zero), 0.0, float(big))  # NaN and inf too
    count = relax.op.astype(count, "int64")
    # times the checked flag (1): the delta check is then an input of the count, not dead code
    count = bb.normalize(relax.op.multiply(count, nonzero))
    count = run_time_checks.checked_sizes(
        bb, count, f"{run_time_checks.site()}: the element count ceil((limit - start) / delta)")
    (n,) = shape_vars(bb, count, 1, "range_n", check=None)
    start, delta = (bb.normalize(relax.op.reshape(v, [1])) for v in (operands[0], operands[2]))

    def kernel(a, step):
        return te.compute((n,), lambda i: a[0] + tirx.Cast(dtype, i) * step[0], name="range")

    return bb.emit_te(kernel, start, delta)


def _known_scalar(value):
    """A scalar operand's value where the import knows it: a constant, or a shape value whose
    arithmetic simplifies to a number (a static dim read through Shape, Gather and Cast, which
    the ONNX-level folding misses where shape inference stopped short of it); else None."""
    import tvm
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    prim = prim_of(value)
    if prim is not None:
        folded = Analyzer().simplify(prim)
        return folded.value if isinstance(folded, (tirx.IntImm, tirx.FloatImm)) else None
    if isinstance(value, tvm.ir.GenericConst):
        arr = value.value.numpy()
        return arr.reshape(-1)[0].item() if arr.size == 1 else None
    return None


def _known_range(operands):
    """Range of known operands as a constant (ONNX's start + i * delta, in their dtype), so
    the sizes behind it stay static: a detector's anchor grid over each feature map otherwise
    becomes a kernel sized at run time. None where an operand is unknown or the output would
    be larger than the pre-import folding builds."""
    import numpy as np
    from tvm import relax

    from .preprocess import _MAX_OUTPUT_ELEMENTS, range_length

    known = [_known_scalar(x) for x in operands]
    dtype = _dtype_of(operands[0])
    if None in known or dtype is None or dtype == "bool" or len(operands) != 3:
        return None
    start, limit, delta = (np.array(v, dtype=dtype) for v in known)
    if delta == 0:
        return None  # TVM's converter reports it
    try:
        if range_length(float(start), float(limit), float(delta)) > _MAX_OUTPUT_ELEMENTS:
            return None
    except (ValueError, OverflowError):  # an infinite or NaN operand: TVM's converter's case
        return None
    return relax.const(np.arange(start, limit, delta).astype(dtype), dtype)


def _dtype_of(value):
    from tvm import relax

    prim = prim_of(value)
    if prim is not None:
        return str(prim.ty)
    if isinstance(value, relax.Expr) and isinstance(value.ty, relax.TensorType):
        return str(value.ty.dtype)
    return None


@register("Reshape")
def reshape(bb, inputs, attr, params, opset):
    """A scalar dim reshaped to [1] / [-1] becomes a one-element ShapeExpr (and [] stays scalar)."""
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
    target_ty = getattr(inputs[1], "ty", None)
    if target is None and not isinstance(inputs[1], relax.ShapeExpr) and \
            isinstance(target_ty, relax.TensorType):
        return _runtime_reshape(bb, data, inputs[1], attr.get("allowzero", 0))
    dims = _symbolic_reshape_dims(data, static_dims(inputs[1]), attr.get("allowzero", 0))
    if dims is not None:
        return relax.op.reshape(data, relax.ShapeExpr(dims))
    return tvm_converter("Reshape", opset)(
        bb, [data, *inputs[1:]], attr, params)


def _factors(dims):
    """The product of `dims` as (constant part, symbolic factors), Mul trees split."""
    from tvm import tirx
    from tvm.sym.analyzer import Analyzer

    analyzer = Analyzer()
    const, factors = 1, []
    stack = [analyzer.simplify(d) for d in dims]
    while stack:
        d = stack.pop()
        if isinstance(d, tirx.IntImm):
            const *= int(d.value)
        elif isinstance(d, tirx.Mul):
            stack += [d.a, d.b]
        else:
            factors.append(d)
    return const, factors


def _symbolic_reshape_dims(data, target, allowzero: int):
    """The dims of a Reshape with a -1 on a symbolically shaped tensor, the -1 found by
    cancelling the known dims' factors out of the input's, else None (TVM's reading applies).

    Relax infers a -1 as `prod(input dims) // prod(known dims)`, which the arithmetic
    simplifier cannot cancel for symbolic dims: the attention heads' `view(-1, past + seq, 16)`
    of a (batch, 4, past + seq, 16) tensor got the dim `batch * (past + seq) * 64 // (past * 16
    + seq * 16)` instead of `batch * 4`. Such a dim cannot be matched against the other
    operands of the matmul that follows, and its floor division by a divisor of unknown sign
    lowers to a let-bound `rmod` that LLVM code generation refuses to bind twice.
    """
    import tvm_ffi
    from tvm import relax, tirx

    ty = getattr(data, "ty", None)
    if target is None or not isinstance(ty, relax.TensorType) \
            or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    in_dims = list(ty.shape.values)
    if all(isinstance(d, tirx.IntImm) for d in in_dims):
        return None
    dims = []
    for k, d in enumerate(target):
        if isinstance(d, tirx.IntImm) and d.value == 0 and not allowzero:
            if k >= len(in_dims):
                return None
            d = in_dims[k]
        dims.append(d)
    holes = [k for k, d in enumerate(dims) if isinstance(d, tirx.IntImm) and d.value == -1]
    if len(holes) != 1:
        return None
    total_c, total = _factors(in_dims)
    known_c, known = _factors([d for k, d in enumerate(dims) if k != holes[0]])
    if known_c <= 0 or total_c % known_c:
        return None
    for f in known:
        hit = next((i for i, g in enumerate(total) if tvm_ffi.structural_equal(f, g)), None)
        if hit is None:
            return None
        total.pop(hit)
    inferred = tirx.IntImm("int64", total_c // known_c)
    for f in total:
        inferred = inferred * f if not (isinstance(inferred, tirx.IntImm)
                                        and inferred.value == 1) else f
    dims[holes[0]] = inferred
    return dims


def gather(bb, inputs, attr, params, opset):
    """Gather from a shape whose dims are unknown at import (a shape-typed var) reads it as a
    tensor (what onnx_ops.indices' Gather calls once its indices are checked)."""
    from tvm import relax

    data = inputs[0]
    if isinstance(data, relax.Expr) and isinstance(data.ty, relax.ShapeType) \
            and not isinstance(data, relax.ShapeExpr):
        data = as_shape_tensor(bb, data)
    indices = inputs[1]
    folded = _gather_static_dims(data, indices)
    if folded is not None:
        return folded
    if prim_of(indices) is not None:
        indices = as_shape_tensor(bb, indices)
    return tvm_converter("Gather", opset)(
        bb, [data, indices, *inputs[2:]], attr, params)


def _gather_static_dims(data, indices):
    """Static dims read from a shape by constant indices, as an int64 constant (else None).

    `torch.chunk` exports its split points as Shape -> Gather([1]) -> Add/Div/Mul -> Slice. TVM
    gathers from the shape at run time when the index is not 0-d, so the split points, and every
    shape after the Slice, would be unknown at compile time even where the channel count is
    static (it is under a symbolic batch too). A constant here lets the arithmetic fold and
    Slice take its static path.
    """
    import numpy as np
    from tvm import relax, tirx

    ints = const_ints(indices)
    if ints is None or not isinstance(data, relax.ShapeExpr) or np.ndim(ints) == 0:
        return None  # a 0-d index is already a scalar dim in TVM's converter
    dims = list(data.values)
    picked = np.asarray(ints, dtype="int64")
    if picked.size == 0 or (picked < -len(dims)).any() or (picked >= len(dims)).any():
        return None
    values = [dims[int(k)] for k in picked.reshape(-1)]
    if not all(isinstance(d, tirx.IntImm) for d in values):
        return None
    return relax.const(np.asarray([int(d) for d in values], "int64").reshape(picked.shape),
                       "int64")


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
def expand(bb, inputs, attr, params, opset):
    """Expand of a symbolically shaped tensor to a constant or symbolic shape, by broadcast rules."""
    from tvm import relax, tirx

    from .run_time_operands import _static_len, is_run_time, shape_vars

    data, shape = inputs[0], inputs[1]
    target = static_dims(shape)
    ty = getattr(data, "ty", None)
    if target is None and isinstance(ty, relax.TensorType) \
            and isinstance(ty.shape, relax.ShapeExpr) and is_run_time(shape, params):
        # TVM broadcasts to the run-time values as they are, so a 1 that should keep the
        # input's dim (shape [2, 1, 6] on a (3, 1) input) shrank it: bind the values to
        # symbolic dims and apply the broadcast rules to them.
        length = _static_len(shape, "shape")
        have = list(ty.shape.values)
        aligned = [1] * (length - len(have)) + have if length >= len(have) else \
            have[len(have) - length:]
        base = relax.op.shape_to_tensor(relax.ShapeExpr(aligned))
        target = shape_vars(bb, shape, length, "expand_", check="expand", base=base,
                            where=run_time_checks.site(1, "shape"))
    if target is None or not isinstance(ty, relax.TensorType) \
            or not isinstance(ty.shape, relax.ShapeExpr):
        return tvm_converter("Expand", opset)(bb, inputs, attr, params)
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


# Ops whose TVM (or tvmopt) converter takes shape values (ShapeExpr / shape-typed vars) as inputs.
SHAPE_AWARE_OPS = {"Reshape", "Resize", "ConstantOfShape", "Gather", "Slice", "Shape", "Expand",
                   "Concat", "Equal", "Where", "Cast", "CastLike", "Squeeze", "Identity"}
# Ops whose converter takes scalar dims (PrimValue / TIR expressions) as inputs.
PRIM_AWARE_OPS = {"Reshape", "Range", "Unsqueeze", "Cast", "CastLike", "Identity", "Add", "Sub",
                  "Mul", "Div", "Equal"}


def _is_shape_value(value) -> bool:
    from tvm import relax

    return isinstance(value, relax.Expr) and isinstance(getattr(value, "ty", None), relax.ShapeType)


def _is_tensor_var(value) -> bool:
    import tvm
    from tvm import relax

    return (isinstance(value, relax.Expr) and not isinstance(value, tvm.ir.GenericConst)
            and isinstance(getattr(value, "ty", None), relax.TensorType))


def materialize_inputs(bb, nodes: dict, node):
    """Return `node`, with shape-value inputs its op cannot take replaced by int64 tensors.

    The tensor is bound under a new name in `nodes` (the importer's value table), and a copy of
    the node refers to it; other consumers keep the symbolic value.
    """
    names = list(node.input)
    changed = False
    op = node.op_type
    values = [nodes.get(n) if n else None for n in names]
    mixed_prims = op in PRIM_AWARE_OPS and any(_is_tensor_var(v) for v in values) \
        and op not in ("Reshape", "Range", "Unsqueeze", "Identity", "Cast", "CastLike")
    # TVM's Concat takes shape values beside constants, not beside computed tensors: there the
    # shape values become int64 tensors too (torch's `x.view(Shape(x)[0], t.size(1), ...)` with
    # one dim computed from a tensor).
    mixed_shapes = op == "Concat" and any(_is_tensor_var(v) for v in values)
    for k, (name, value) in enumerate(zip(names, values)):
        if value is None:
            continue
        shape_val = _is_shape_value(value) and (op not in SHAPE_AWARE_OPS or mixed_shapes)
        prim_val = prim_of(value) is not None and (op not in PRIM_AWARE_OPS or mixed_prims)
        if not (shape_val or prim_val):
            continue
        alias = f"{name}__tvmopt_tensor"
        if alias not in nodes:
            nodes[alias] = as_shape_tensor(bb, value)
        names[k] = alias
        changed = True
    if not changed:
        return node
    import onnx

    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    del copy.input[:]
    copy.input.extend(names)
    return copy


def _runtime_reshape(bb, data, shape, allowzero: int):
    """Reshape to a shape known only at run time (ONNX 0 and -1 resolved in the graph)."""
    from tvm import relax, tirx

    sty = shape.ty
    if sty.ndim != 1 or not isinstance(sty.shape, relax.ShapeExpr) or \
            not isinstance(sty.shape.values[0], tirx.IntImm):
        raise ValueError("Reshape to a run-time shape needs a 1-d shape of known length")
    length = int(sty.shape.values[0].value)
    rank = data.ty.ndim
    shape = bb.normalize(relax.op.astype(shape, "int64")) if str(sty.dtype) != "int64" else shape
    dims = bb.normalize(relax.op.shape_to_tensor(relax.op.shape_of(data)))
    zero = relax.const(0, "int64")
    minus_one = relax.const(-1, "int64")
    if not allowzero and rank is not None and rank >= 0:
        # 0 copies the input dim at the same position.
        if length <= rank:
            same_pos = relax.op.strided_slice(dims, axes=[0], begin=[0], end=[length])
        else:
            same_pos = relax.op.concat([dims, relax.const([1] * (length - rank), "int64")], 0)
        shape = bb.normalize(relax.op.where(relax.op.equal(shape, zero), same_pos, shape))
    total = relax.op.prod(dims, keepdims=True)
    known = relax.op.prod(relax.op.where(relax.op.equal(shape, minus_one),
                                         relax.const(1, "int64"), shape), keepdims=True)
    inferred = relax.op.floor_divide(total, relax.op.maximum(known, relax.const(1, "int64")))
    shape = bb.normalize(relax.op.where(relax.op.equal(shape, minus_one), inferred, shape))
    shape = run_time_checks.checked_sizes(bb, shape, run_time_checks.site(1, "shape"), "reshape",
                                          base=total)
    from tvm.relax.frontend.onnx.onnx_frontend import _tensor_to_shape_expr

    return relax.op.reshape(data, _tensor_to_shape_expr(bb, shape, length, "reshape_dim"))


def _has_min_max(expr) -> bool:
    from tvm import tirx

    if isinstance(expr, (tirx.Min, tirx.Max)):
        return True
    return any(_has_min_max(getattr(expr, k)) for k in ("a", "b", "value")
               if tvm_is_prim(getattr(expr, k, None)))


def tvm_is_prim(value) -> bool:
    import tvm

    return value is not None and tvm.ir.is_prim_expr(value)


def dims_of(value) -> list:
    """The symbolic (non-constant) dims of a tensor value's shape."""
    from tvm import relax, tirx

    ty = getattr(value, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return []
    return [d for d in ty.shape.values if not isinstance(d, tirx.IntImm)]


def tighten_shape(bb, value, known_dims):
    """`value` with the clamps in its shape simplified away where the dims already seen rule
    them out.

    Shape inference clamps a slice's length, `min(max(n - 1, 0), n)` for `x[..., :-1]`, since it
    cannot tell that `n - 1` is not negative; every dim of a tensor that exists is, so with
    those facts the length is `n - 1` again, the same expression as the other operand's dim in
    the add that follows (wav2vec2's position convolution), whose shape then stays known.
    A simplified shape is asserted with a match_cast (checked when the artifact runs).
    """
    from tvm import relax
    from tvm.sym.analyzer import Analyzer

    ty = getattr(value, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return value
    vals = list(ty.shape.values)
    if not any(_has_min_max(v) for v in vals):
        return value
    analyzer = Analyzer()
    with ExitStack() as scopes:
        for d in known_dims:
            scopes.enter_context(analyzer.constraint_scope(d >= 0))
        new = [analyzer.simplify(v) for v in vals]
    if all(a.same_as(b) for a, b in zip(vals, new)) or any(_has_min_max(v) for v in new):
        return value
    return bb.match_cast(_bound(bb, value), relax.TensorType(new, ty.dtype))


def agree_broadcast_dims(bb, inputs: list) -> list:
    """Operands of a broadcasting op whose dims are the same number written two ways (a
    convolution stack's output length `(n - 105) // 80 + 1` beside a reshape's nested
    `1 + (((n // 5) - 9) // 4 - 3) // 4`; a padded window count beside the mask built for it):
    the result's shape is unknown to Relax and the next reshape fails ("Reshape expects the
    input tensor to have known shape"). ONNX broadcasting requires dims that are not 1 to be
    equal, so the operands are asserted (match_cast, checked when the artifact runs) to the
    simplest spelling of each such dim (floor division before ONNX's truncating one, else the
    shorter); a static dim beside a symbolic one is left to broadcasting as before. Dims that are 1, or may be 1 on one side only
    as a literal, broadcast as before."""
    from tvm import relax, tirx

    tensors = [(i, v) for i, v in enumerate(inputs)
               if isinstance(getattr(v, "ty", None), relax.TensorType)
               and isinstance(v.ty.shape, relax.ShapeExpr)]
    if len(tensors) < 2:
        return inputs
    rank = max(len(v.ty.shape.values) for _, v in tensors)
    agreed = []
    for axis in range(rank):
        dims = []
        for _, v in tensors:
            vals = v.ty.shape.values
            k = axis - (rank - len(vals))
            if k >= 0 and not (isinstance(vals[k], tirx.IntImm) and vals[k].value == 1):
                dims.append(vals[k])
        if len(dims) < 2 or all(tvm_equal(dims[0], d) for d in dims[1:]):
            agreed.append(None)
            continue
        if any(isinstance(d, tirx.IntImm) for d in dims):
            # A number beside an expression: not two spellings of one length for certain (a
            # slice to INT_MAX on an unknown dim has a bogus static length); left as it was.
            agreed.append(None)
            continue
        agreed.append(min(dims, key=_spelling_cost))
    if all(a is None for a in agreed):
        return inputs
    out = list(inputs)
    for i, v in tensors:
        vals = list(v.ty.shape.values)
        new = list(vals)
        for k in range(len(vals)):
            a = agreed[k + rank - len(vals)]
            if a is not None and not (isinstance(vals[k], tirx.IntImm) and vals[k].value == 1):
                new[k] = a
        if not all(tvm_equal(x, y) for x, y in zip(vals, new)):
            out[i] = bb.match_cast(_bound(bb, v), relax.TensorType(new, v.ty.dtype))
    return out


def _spelling_cost(dim) -> tuple:
    """Floor division before truncating division (ONNX's integer Div; TVM's index analysis
    cannot split loops over truncated quotients), then the shorter expression."""
    text = str(dim)
    return ("T.Div(" in text or "truncdiv" in text, len(text))


def tvm_equal(a, b) -> bool:
    import tvm.ir.prim

    return bool(tvm.ir.prim.expr_deep_equal(a, b))


def _bound(bb, value):
    """`value` as a variable: a match_cast of an unbound call loses its type in later passes."""
    from tvm import relax

    return value if isinstance(value, relax.Var) else bb.emit(value)


@register("Concat")
def concat(bb, inputs, attr, params, opset):
    """Concat whose inputs agree on every other axis only at run time: the spec requires them
    equal, so each input is asserted (match_cast, checked when the artifact runs) to the first
    one's dims there, or to a static dim where an input has one. A UNet's upsampled decoder map is `2 * (h // 8)` rows where its skip
    connection has `h // 4`: equal for the sizes it takes, unprovable for a symbolic `h`, and
    without the assertion the concatenation's shape, and everything after it, is unknown."""
    from tvm import relax, tirx
    from tvm.sym.analyzer import Analyzer

    # Shape pieces that went through a tensor (Cast of a Shape slice: torch's `x.shape[2:]`
    # passed to interpolate) are concatenated as the shape they are, so the dims stay symbolic.
    axis = attr.get("axis", 0)
    pieces = [_shape_dims(bb, v) for v in inputs if v is not None]
    if pieces and all(p is not None for p in pieces) and \
            any(const_ints(v) is None for v in inputs if v is not None):
        return relax.ShapeExpr([d for p in pieces for d in p])
    tensors = [v for v in inputs if v is not None]
    known = [v for v in tensors if isinstance(getattr(v, "ty", None), relax.TensorType)
             and isinstance(v.ty.shape, relax.ShapeExpr)]
    if len(known) == len(tensors) > 1 and len({v.ty.ndim for v in known}) == 1:
        rank = known[0].ty.ndim
        axis = axis + rank if axis < 0 else axis
        # Each other axis's dim as the first input has it, or as a number where an input has
        # one: the symbolic side is asserted to the number, never the number to a symbol. TVM's
        # CanonicalizeBindings drops a match_cast of `1` to `batch` (a decoder's new key, batch
        # fixed at 1, beside a past of symbolic batch) as if it were trivial, and the concat's
        # shape then goes unknown ("emit_te now only supports Tensor that has ShapeExpr shape").
        ref = list(known[0].ty.shape.values)
        for v in known[1:]:
            ref = [d if k != axis and isinstance(d, tirx.IntImm) and not isinstance(r, tirx.IntImm)
                   else r for k, (d, r) in enumerate(zip(v.ty.shape.values, ref))]
        analyzer = Analyzer()
        fixed = []
        for v in inputs:
            dims = list(v.ty.shape.values) if v is not None else None
            if dims is not None and any(k != axis and not analyzer.can_prove_equal(d, r)
                                        for k, (d, r) in enumerate(zip(dims, ref))):
                target = [d if k == axis else r for k, (d, r) in enumerate(zip(dims, ref))]
                v = bb.match_cast(_bound(bb, v), relax.TensorType(target, v.ty.dtype))
            fixed.append(v)
        inputs = fixed
    return tvm_converter("Concat", opset)(bb, inputs, attr, params)


def _shape_dims(bb, value):
    """The dims of a shape value, or of an int tensor that is one (`shape_to_tensor(S)`, cast
    to an int type, or a constant): a list of TIR expressions, else None."""
    from tvm import relax, tirx

    if isinstance(value, relax.ShapeExpr):
        return list(value.values)
    ints = const_ints(value)
    if isinstance(ints, list):
        return [tirx.IntImm("int64", int(i)) for i in ints]
    seen = 0
    while isinstance(value, (relax.Var, relax.Call)) and seen < 4:
        seen += 1
        bound = bb.lookup_binding(value) if isinstance(value, relax.Var) else value
        if not isinstance(bound, relax.Call):
            return None
        name = getattr(bound.op, "name", "")
        if name == "relax.shape_to_tensor" and isinstance(bound.args[0], relax.ShapeExpr):
            return list(bound.args[0].values)
        if name == "relax.astype" and "int" in str(bound.ty.dtype):
            value = bound.args[0]
            continue
        return None
    return None


@register("Tile")
def tile(bb, inputs, attr, params, opset):
    """Tile by repeats computed from shapes (DETR's `queries.unsqueeze(0).repeat(batch, 1, 1)`)
    keeps the output dims symbolic (`batch * 1`) where TVM's converter gives them fresh vars
    that match nothing downstream: x reshaped to (1, d0, 1, d1, ..), broadcast to
    (r0, d0, r1, d1, ..) and flattened pairwise, which is tile's layout, r copies of each axis."""
    from tvm import relax

    x = inputs[0]
    reps = _shape_dims(bb, inputs[1]) if inputs[1] is not None else None
    ty = getattr(x, "ty", None)
    if reps is None or const_ints(inputs[1]) is not None or not isinstance(ty, relax.TensorType) \
            or not isinstance(ty.shape, relax.ShapeExpr) or len(reps) != ty.ndim:
        repeats = as_shape_tensor(bb, inputs[1])
        if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr) and \
                _is_tensor_var(inputs[1]):
            repeats = run_time_checks.checked_sizes(
                bb, repeats, run_time_checks.site(1, "repeats"), "tile",
                base=relax.op.shape_to_tensor(ty.shape))
        return tvm_converter("Tile", opset)(bb, [x, repeats], attr, params)
    dims = list(ty.shape.values)
    inter = [v for d in dims for v in (1, d)]
    wide = [v for r, d in zip(reps, dims) for v in (r, d)]
    y = relax.op.broadcast_to(relax.op.reshape(x, relax.ShapeExpr(inter)), relax.ShapeExpr(wide))
    return relax.op.reshape(y, relax.ShapeExpr([r * d for r, d in zip(reps, dims)]))
