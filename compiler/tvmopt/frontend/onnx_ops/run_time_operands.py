"""Operands given at run time (graph inputs, not initializers) that set an output's shape.

Relax can carry a data-dependent shape: the operand tensor becomes a shape
(`relax.op.tensor_to_shape`), `match_cast` binds it to fresh symbolic vars, and the kernels are
emitted over those vars; the VM computes the real shape when the artifact runs. The artifact
keeps taking the operand as a normal input. Each converter here handles the run-time case and
hands the constant case, unchanged, to the converter it wraps.
"""

from __future__ import annotations

import functools
import itertools

from .. import run_time_checks
from . import register, tvm_converter

_REDUCE_OPS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
               "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
_fresh = itertools.count()


def _base_converter(op_type: str, opset: int):
    """The converter this module wraps: tvmopt's own where it has one, else TVM's."""
    from . import reduce

    if op_type == "ReduceLogSumExp":
        return functools.partial(reduce.reduce_log_sum_exp, opset=opset)
    return tvm_converter(op_type, opset)


def is_run_time(value, params) -> bool:
    """True when `value` is an operand computed or fed at run time (not a constant)."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx.onnx_frontend import get_constant

    if value is None:
        return False
    value = get_constant(value, params)
    return not isinstance(value, (tvm.ir.GenericConst, relax.ShapeExpr))


def shape_vars(bb, tensor, n: int, hint: str, check: str | None = "dims", **limits):
    """Bind the n int64 values of a 1-D run-time tensor to fresh symbolic vars.

    check: how the values are checked first (a run_time_checks.SIZE_MODES mode: by default
    each a size >= 0 and their element count within the compile's limit, the error naming the
    node being converted); None where the graph computed them from shapes, in range by
    construction. `limits`: low/high/base for the check.
    """
    from tvm import relax, tirx

    if check is not None:
        tensor = run_time_checks.checked_sizes(bb, tensor, mode=check, **limits)
    shape = bb.emit(relax.op.tensor_to_shape(tensor))
    names = [f"{hint}{next(_fresh)}" for _ in range(n)]
    dims = [tirx.Var(name, "int64") for name in names]
    bb.match_cast(shape, relax.ShapeType(dims))
    return dims


def _static_len(value, what: str, unknown_ok: bool = False) -> int | None:
    """The static length of a 1-D operand; None (if unknown_ok) when TVM imported it symbolic
    (it does so for a declared length 0)."""
    from tvm import tirx

    shape = getattr(value.ty, "shape", None)
    if shape is None or len(shape) != 1:
        raise ValueError(f"operand '{what}' needs a static 1-D shape to be given at run time")
    if not isinstance(shape[0], (int, tirx.IntImm)):
        if unknown_ok:
            return None
        raise ValueError(f"operand '{what}' has a length unknown at compile time; "
                         "make it a constant")
    return int(shape[0])


def _reduce_run_time_axes(bb, op_type, opset, inputs, attr, params, bool_input=False):
    """Reduce over axes known only at run time, through a reshape to fixed axes.

    Each dim d_k becomes the pair (e_k, g_k) = (1, d_k) when axis k is reduced, else (d_k, 1);
    reshaping x to (e_0, g_0, e_1, g_1, ...) keeps its element order, so reducing the fixed
    axes 1, 3, 5, ... with keepdims=0 gives exactly the keepdims=1 result, shape (e_0, e_1, ...).
    """
    import numpy as np
    from tvm import relax, tirx

    x, axes = inputs[0], inputs[1]
    rank = x.ty.ndim
    n_axes = _static_len(axes, "axes", unknown_ok=True)
    if n_axes == 0:  # an empty axes tensor: its meaning is static (all axes, or no-op)
        base = _base_converter(op_type, opset)
        return base(bb, [x, relax.const(np.zeros(0, "int64"), "int64")], attr, params)
    noop = bool(attr.get("noop_with_empty_axes", 0))
    if n_axes is None and not attr.get("keepdims", 1):
        raise ValueError("operand 'axes' has a length unknown at compile time and keepdims=0, "
                         "so the output rank is unknown; make axes a constant")
    if n_axes is None and noop and op_type not in ("ReduceSum", "ReduceMean", "ReduceMax",
                                                     "ReduceMin", "ReduceProd"):
        raise ValueError("operand 'axes' may be empty at run time with noop_with_empty_axes=1; "
                         f"{op_type} of one element is not the identity: make axes a constant")
    a = relax.op.astype(axes, "int64")
    a = relax.op.where(relax.op.less(a, relax.const(0, "int64")),
                       relax.op.add(a, relax.const(rank, "int64")), a)
    hits = relax.op.equal(relax.op.expand_dims(a, 1),
                          relax.const(np.arange(rank, dtype="int64")[None, :], "int64"))
    flag = relax.op.greater(relax.op.sum(relax.op.astype(hits, "int64"), [0]),
                            relax.const(0, "int64"))
    if n_axes is None:  # empty at run time: every axis (or none, with noop_with_empty_axes)
        length = relax.op.astype(relax.op.shape_to_tensor(relax.op.shape_of(axes)), "int64")
        flag = relax.op.where(relax.op.equal(length, relax.const(0, "int64")),
                              relax.const(np.full(rank, not noop), "bool"), flag)
    flag = bb.emit(flag)
    dims = bb.emit(relax.op.astype(relax.op.shape_to_tensor(relax.op.shape_of(x)), "int64"))
    one = relax.const(np.ones(rank, "int64"), "int64")
    kept = relax.op.where(flag, one, dims)
    gone = relax.op.where(flag, dims, one)
    pairs = bb.emit(relax.op.reshape(relax.op.stack([kept, gone], axis=1), [2 * rank]))
    split_dims = shape_vars(bb, pairs, 2 * rank, "reduce_d", check=None)
    xs = bb.emit(relax.op.reshape(x, relax.ShapeExpr(split_dims)))
    fixed = relax.const(np.arange(1, 2 * rank, 2, dtype="int64"), "int64")
    base = _base_converter(op_type, opset)
    out = bb.normalize(base(bb, [xs, fixed], {**attr, "keepdims": 0,
                                              "noop_with_empty_axes": 0}, params))
    # TVM's reductions over an empty axis do not give the identity: an empty reduced set
    # (known only at run time here) gets it explicitly.
    empty = relax.op.equal(relax.op.prod(gone), relax.const(0, "int64"))
    out = bb.emit(relax.op.where(empty, _identity(op_type, str(x.ty.dtype), bool_input), out))
    if attr.get("keepdims", 1):
        return out
    # keepdims=0: the kept dims in order, n_axes fewer (ONNX forbids repeated axes). Kept axis k
    # lands at k - (reduced axes before k); computed with elementwise ops and sums (argsort and
    # cumsum have no llvm legalization in this pipeline).
    n_out = rank - n_axes
    if n_out == 0:
        return bb.emit(relax.op.reshape(out, []))
    f = relax.op.astype(flag, "int64")
    before = relax.op.sum(relax.op.multiply(
        relax.const(np.tril(np.ones((rank, rank), "int64"), -1), "int64"),
        relax.op.expand_dims(f, 0)), [1])
    pos = relax.op.subtract(relax.const(np.arange(rank, dtype="int64"), "int64"), before)
    lands = relax.op.astype(relax.op.equal(
        relax.op.expand_dims(pos, 1),
        relax.const(np.arange(n_out, dtype="int64")[None, :], "int64")), "int64")
    keep = relax.op.subtract(relax.const(1, "int64"), f)
    kept_dims = bb.emit(relax.op.sum(relax.op.multiply(
        relax.op.expand_dims(relax.op.multiply(dims, keep), 1), lands), [0]))
    return bb.emit(relax.op.reshape(out, relax.ShapeExpr(
        shape_vars(bb, kept_dims, n_out, "reduce_o", check=None))))


def _identity(op_type: str, dtype: str, bool_input: bool):
    """The value ONNX gives a reduction over an empty set, as a scalar constant of `dtype`."""
    import numpy as np
    from tvm import relax

    if op_type in ("ReduceMax", "ReduceMin") and bool_input:
        value = 0 if op_type == "ReduceMax" else 1  # False / True, reduced as int8
    elif op_type in ("ReduceMax", "ReduceMin"):
        info = np.finfo(dtype) if dtype.startswith("float") else np.iinfo(dtype)
        low, high = (-np.inf, np.inf) if dtype.startswith("float") else (info.min, info.max)
        value = low if op_type == "ReduceMax" else high
    elif op_type in ("ReduceLogSum", "ReduceLogSumExp"):
        value = -np.inf
    elif op_type == "ReduceProd":
        value = 1
    else:  # sums and norms
        value = 0
    return relax.const(np.array(value, dtype=dtype), dtype)


def _make_reduce(op_type: str):
    class Reduce:
        @classmethod
        def get_converter(cls, opset):
            base = _base_converter(op_type, opset)

            def convert(bb, inputs, attr, params):
                from tvm import relax

                x = inputs[0]
                as_bool = op_type in ("ReduceMax", "ReduceMin") and str(x.ty.dtype) == "bool"
                if as_bool:  # TVM has no min/max identity for bool: reduce it as int8
                    inputs = [bb.normalize(relax.op.astype(x, "int8"))] + list(inputs)[1:]
                def reduce(ins, as_bool):
                    if len(ins) > 1 and is_run_time(ins[1], params):
                        return _reduce_run_time_axes(bb, op_type, opset, ins, attr, params,
                                                     as_bool)
                    return base(bb, ins, attr, params)

                out = reduce(inputs, as_bool)
                dtype = str(x.ty.dtype)
                if op_type in ("ReduceMax", "ReduceMin") and dtype.startswith(("float", "bfloat")):
                    # TVM's max/min start from the lowest/highest *finite* value, so a slice of
                    # only -inf (max) or +inf (min) came out finite; the spec's result is the
                    # infinity (the fully-masked-row checks of attention graphs rely on it).
                    import numpy as np

                    inf = relax.const(np.array(-np.inf if op_type == "ReduceMax" else np.inf,
                                               dtype=dtype), dtype)
                    # all-infinite = not any(x != -inf) for max, all(x == +inf) for min (the
                    # same reduction over int8 flags, whose empty-set identity also fits)
                    is_max = op_type == "ReduceMax"
                    cmp = relax.op.not_equal if is_max else relax.op.equal
                    flags = bb.normalize(relax.op.astype(cmp(x, inf), "int8"))
                    hit = relax.op.astype(bb.normalize(reduce([flags] + list(inputs)[1:], True)),
                                          "bool")
                    out = bb.normalize(out)
                    # run-time axes bind fresh dims per reduction: tie hit's to out's
                    hit = bb.match_cast(bb.normalize(hit), relax.TensorType(out.ty.shape, "bool"))
                    out = relax.op.where(hit, out, inf) if is_max else \
                        relax.op.where(hit, inf, out)
                return relax.op.astype(bb.normalize(out), "bool") if as_bool else out

            return convert

    Reduce.__name__ = Reduce.__qualname__ = op_type
    Reduce.__doc__ = f"{op_type}, with axes given as a constant or at run time."
    return register(op_type)(Reduce)


for _op in _REDUCE_OPS:
    _make_reduce(_op)


def _i64(values):
    import numpy as np
    from tvm import relax

    return relax.const(np.asarray(values, dtype="int64"), "int64")


def _dims_tensor(bb, x):
    from tvm import relax

    return bb.emit(relax.op.astype(relax.op.shape_to_tensor(relax.op.shape_of(x)), "int64"))


def _axes_onehot(axes, n_axes: int, rank: int):
    """(n_axes, rank) int64: row i is one-hot at axes[i] (negative axes counted from the end)."""
    import numpy as np
    from tvm import relax

    if axes is None:
        axes = _i64(np.arange(n_axes))
    a = relax.op.astype(axes, "int64")
    a = relax.op.where(relax.op.less(a, _i64(0)), relax.op.add(a, _i64(rank)), a)
    return relax.op.astype(relax.op.equal(relax.op.expand_dims(a, 1),
                                          _i64(np.arange(rank)[None, :])), "int64")


def _with_dims(bb, x, hint: str):
    """`x` with a ShapeExpr shape (TE kernels need one): unknown dims bound to fresh vars."""
    from tvm import relax, tirx

    if isinstance(x.ty.shape, relax.ShapeExpr):
        return x
    dims = [tirx.Var(f"{hint}{next(_fresh)}", "int64") for _ in range(x.ty.ndim)]
    return bb.match_cast(x, relax.TensorType(dims, x.ty.dtype))


def _operand(value, params):
    """A constant operand as its Relax constant, a run-time one as is."""
    from tvm.relax.frontend.onnx.onnx_frontend import get_constant

    return None if value is None else get_constant(value, params)


@register("Slice")
class Slice:
    """Slice with starts/ends/axes/steps fed at run time: the clamped begin, step and length of
    every axis are computed on the host and bound to symbolic vars; the kernel gathers
    x[begin + i * step]. Constant operands use TVM's converter."""

    @classmethod
    def get_converter(cls, opset):
        base = tvm_converter("Slice", opset)

        def convert(bb, inputs, attr, params):
            import tvm
            from tvm import relax

            if opset < 10 or not any(is_run_time(v, params) for v in list(inputs)[1:5]):
                out = bb.normalize(base(bb, inputs, attr, params))
                expect = cls._unclamped(out)
                if expect is None or not run_time_checks.enabled():
                    return out
                # clamped as the spec says, and checked to come out as long as TVM claimed
                # (which the rest of the graph was built on)
                # shape values (a ShapeExpr, a dim as a TIR expression) as the int64 tensors
                # they stand for
                operands = [bb.normalize(relax.op.shape_to_tensor(
                    relax.ShapeExpr([v]) if tvm.ir.is_prim_expr(v) else v))
                    if v is not None and (tvm.ir.is_prim_expr(v) or isinstance(
                        getattr(v, "ty", None), relax.ShapeType)) else v
                    for v in list(inputs)[1:5]]
                return cls._run_time(bb, [inputs[0], *operands] + [None] * (4 - len(operands)),
                                     params, expect=expect)
            return cls._run_time(bb, list(inputs) + [None] * (5 - len(inputs)), params)

        return convert

    @staticmethod
    def _unclamped(out):
        """The output dims TVM's converter claims for a slice whose bounds it computed from
        shapes without clamping them (assume_inbound: `position_ids[:, :seq]` reads past a
        table of 512 when seq is 517), where a bound is symbolic on an axis of static length;
        else None."""
        from tvm import relax, tirx

        if not (isinstance(out, relax.Call) and getattr(out.op, "name", "") ==
                "relax.strided_slice" and out.attrs.assume_inbound):
            return None
        ty = out.args[0].ty
        if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
            return None
        dims = ty.shape.values
        axes, begins, ends = (t.fields for t in out.args[1:4])  # TIR expressions
        if not any(isinstance(dims[int(a)], tirx.IntImm) and not isinstance(b, tirx.IntImm)
                   for a, *pair in zip(axes, begins, ends) for b in pair):
            return None
        claimed = getattr(getattr(out, "ty", None), "shape", None)
        return list(claimed.values) if isinstance(claimed, relax.ShapeExpr) else None

    @staticmethod
    def _run_time(bb, inputs, params, expect=None):
        """`expect`: the output dims the graph was built on, each checked at run time to equal
        the clamped length (else an error naming the node); None: fresh dims."""
        import numpy as np
        from tvm import relax, te, tirx

        import tvm

        x = inputs[0]
        rank = x.ty.ndim
        if rank is None or rank < 0:
            raise ValueError("Slice with starts/ends computed at run time needs an input of "
                             "known rank")
        x = _with_dims(bb, x, "slice_in_")
        starts, ends = _operand(inputs[1], params), _operand(inputs[2], params)
        axes, steps = _operand(inputs[3], params), _operand(inputs[4], params)
        n = _static_len(starts, "starts")
        # Axes the slice cannot touch keep the input's dims (not fresh ones), so that a later
        # Concat or elementwise op can still match them (chunk along H under a symbolic batch).
        if axes is None:
            const_axes = list(range(n))
        elif isinstance(axes, tvm.ir.GenericConst):
            const_axes = [int(a) for a in axes.value.numpy().reshape(-1)]
        else:
            const_axes = None
        touched = set(range(rank)) if const_axes is None else \
            {a + rank if a < 0 else a for a in const_axes}
        hot = bb.emit(_axes_onehot(axes, n, rank))  # (n, rank)
        hit = relax.op.greater(relax.op.sum(hot, [0]), _i64(0))

        def spread(v, default):
            v = relax.op.astype(v, "int64")
            s = relax.op.sum(relax.op.multiply(relax.op.expand_dims(v, 1), hot), [0])
            return relax.op.where(hit, s, default)

        d = _dims_tensor(bb, x)
        t = spread(steps, _i64(np.ones(rank))) if steps is not None else _i64(np.ones(rank))
        t = bb.emit(t)
        if steps is not None and not isinstance(steps, tvm.ir.GenericConst):
            t = run_time_checks.checked_sizes(bb, t, run_time_checks.site(4, "steps"), "nonzero")
        s = bb.emit(spread(starts, _i64(np.zeros(rank))))
        e = bb.emit(spread(ends, d))
        zero = _i64(0)
        s = relax.op.where(relax.op.less(s, zero), relax.op.add(s, d), s)
        e = relax.op.where(relax.op.less(e, zero), relax.op.add(e, d), e)
        pos = relax.op.greater(t, zero)
        dm1 = relax.op.subtract(d, _i64(1))
        s = bb.emit(relax.op.where(pos, relax.op.minimum(relax.op.maximum(s, zero), d),
                                   relax.op.minimum(relax.op.maximum(s, zero), dm1)))
        e = bb.emit(relax.op.where(pos, relax.op.minimum(relax.op.maximum(e, zero), d),
                                   relax.op.minimum(relax.op.maximum(e, _i64(-1)), dm1)))
        span = relax.op.where(pos, relax.op.subtract(e, s), relax.op.subtract(s, e))
        at = relax.op.abs(t)
        length = relax.op.maximum(
            relax.op.floor_divide(relax.op.subtract(relax.op.add(span, at), _i64(1)), at), zero)
        length = bb.emit(length)
        if expect is not None:
            # the dims the graph was built on, not fresh ones: a match_cast equating the two
            # would let later passes rename the input's dims after vars bound only here
            where = (f"{run_time_checks.site()}: the slice's length on each axis, clamped to "
                     "its input, against the length the rest of the graph assumes from the "
                     "input shapes")
            length = run_time_checks.checked_sizes(
                bb, length, where, "equal", base=relax.op.shape_to_tensor(relax.ShapeExpr(expect)))

            def gather_as_assumed(data, begin, step, n):
                # i < n[k] holds once the check passed; the min also makes the kernel read
                # the checked lengths, so the check runs first and stays in the graph
                return te.compute(expect, lambda *i: data[tuple(
                    begin[k] + tirx.Min(tirx.Cast("int64", i[k]), n[k] - 1) * step[k]
                    for k in range(rank))], name="slice")

            return bb.emit_te(gather_as_assumed, x, s, t, length)
        fresh = shape_vars(bb, length, rank, "slice_", check=None)
        out_shape = [fresh[k] if k in touched else x.ty.shape.values[k] for k in range(rank)]

        def gather(data, begin, step):  # begin/step are read from tensors: only shapes bind vars
            return te.compute(out_shape, lambda *i: data[tuple(
                begin[k] + i[k] * step[k] for k in range(rank))], name="slice")

        return bb.emit_te(gather, x, s, t)


@register("Unsqueeze")
class Unsqueeze:
    """Unsqueeze with axes fed at run time: a reshape to dims computed on the host (the output
    rank, rank + len(axes), is static). Constant axes use TVM's converter."""

    @classmethod
    def get_converter(cls, opset):
        base = tvm_converter("Unsqueeze", opset)

        def convert(bb, inputs, attr, params):
            import tvm

            if opset < 13 or len(inputs) < 2 or not is_run_time(inputs[1], params):
                axes = _operand(inputs[1], params) if opset >= 13 and len(inputs) > 1 else None
                if isinstance(axes, tvm.ir.GenericConst) and axes.value.numpy().ndim == 0:
                    # a scalar axis (onnx's own AffineGrid expansion writes one): as [axis]
                    from tvm import relax

                    inputs = [inputs[0], relax.const(axes.value.numpy().reshape(1))]
                return base(bb, inputs, attr, params)
            return cls._run_time(bb, inputs[0], inputs[1])

        return convert

    @staticmethod
    def _run_time(bb, x, axes):
        import numpy as np
        from tvm import relax

        rank = x.ty.ndim
        n = _static_len(axes, "axes")
        out_rank = rank + n
        flag = relax.op.sum(_axes_onehot(axes, n, out_rank), [0])  # 1 where a new axis goes
        before = relax.op.sum(relax.op.multiply(
            _i64(np.tril(np.ones((out_rank, out_rank)), -1)), relax.op.expand_dims(flag, 0)), [1])
        src = relax.op.subtract(_i64(np.arange(out_rank)), before)  # input dim at position j
        picks = relax.op.astype(relax.op.equal(relax.op.expand_dims(src, 1),
                                               _i64(np.arange(rank)[None, :])), "int64")
        d = _dims_tensor(bb, x)
        moved = relax.op.sum(relax.op.multiply(picks, relax.op.expand_dims(d, 0)), [1])
        keep = relax.op.subtract(_i64(1), flag)
        dims = bb.emit(relax.op.add(flag, relax.op.multiply(keep, moved)))
        return bb.emit(relax.op.reshape(x, relax.ShapeExpr(shape_vars(bb, dims, out_rank,
                                                                        "unsq_", check=None))))


@register("Pad")
class Pad:
    """Pad (opset 11+) with pads, constant_value or axes computed/fed at run time: the pads are
    spread over every axis on the host, the output dims bound to symbolic vars, and the kernel
    maps each output index back (constant, edge, reflect, wrap). Constant operands: TVM's."""

    @classmethod
    def get_converter(cls, opset):
        base = tvm_converter("Pad", opset)

        def convert(bb, inputs, attr, params):
            mode = attr.get("mode", b"constant")
            mode = mode.decode("ascii") if isinstance(mode, bytes) else mode
            if opset < 11 or not any(is_run_time(v, params) for v in list(inputs)[1:4]):
                op = cls._relax_pad(bb, inputs, attr, params, opset) if mode == "constant" \
                    else None
                return op if op is not None else base(bb, inputs, attr, params)
            return cls._run_time(bb, list(inputs) + [None] * (4 - len(inputs)), mode, params)

        return convert

    @staticmethod
    def _relax_pad(bb, inputs, attr, params, opset):
        """A constant-mode float pad with static widths as relax's nn.pad, not TVM's call_tir of
        topi: an op the passes can see, so a zero pad before a convolution folds into its
        padding (passes/fold_pad.py) and layout conversion does not wrap it in transposes.
        None where TVM's converter keeps the case (negative pads crop)."""
        from tvm import relax
        from tvm.relax.frontend.onnx import onnx_frontend

        x = inputs[0]
        if not str(x.ty.dtype).startswith(("float", "bfloat")):
            return None
        if opset < 11:
            pads = [int(p) for p in attr.get("pads", ())]
            before, after = pads[: len(pads) // 2], pads[len(pads) // 2:]
            value = float(attr.get("value", 0.0))
        else:
            before, after, value = onnx_frontend.Pad._parse_pads_and_axes(inputs, params)
        if len(before) != x.ty.ndim or min(before + after, default=0) < 0:
            return None
        width = [int(v) for pair in zip(before, after) for v in pair]
        return bb.emit(relax.op.nn.pad(x, width, "constant", float(value)))

    @staticmethod
    def _run_time(bb, inputs, mode, params):
        import numpy as np
        from tvm import relax, te, tirx

        x = inputs[0]
        rank, dtype = x.ty.ndim, str(x.ty.dtype)
        pads, cval, axes = (_operand(v, params) for v in inputs[1:4])
        n = _static_len(pads, "pads") // 2
        if axes is None and n != rank:
            raise ValueError(f"pads has {2 * n} values for a rank-{rank} input")
        hot = bb.emit(_axes_onehot(axes, n, rank))
        pads = relax.op.astype(pads, "int64")

        def spread(part):
            return relax.op.sum(relax.op.multiply(relax.op.expand_dims(part, 1), hot), [0])

        before = bb.emit(spread(relax.op.strided_slice(pads, [0], [0], [n])))
        after = spread(relax.op.strided_slice(pads, [0], [n], [2 * n]))
        dims = relax.op.add(relax.op.add(_dims_tensor(bb, x), before), after)
        out_shape = shape_vars(bb, bb.emit(dims), rank, "pad_")
        if cval is None or mode != "constant":
            cval = relax.const(np.zeros(1, dtype), dtype)
        else:
            cval = bb.normalize(relax.op.reshape(relax.op.astype(cval, dtype), [1]))

        def kernel(data, pb, value):
            def at(*i):
                zero, one, two = (tirx.const(v, "int64") for v in (0, 1, 2))
                src = [tirx.Cast("int64", i[k]) - pb[k] for k in range(rank)]
                size = [tirx.Cast("int64", data.shape[k]) for k in range(rank)]
                if mode == "constant":
                    inside = tirx.all(*[tirx.And(s >= zero, s < d) for s, d in zip(src, size)])
                    safe = [tirx.Min(tirx.Max(s, zero), d - one) for s, d in zip(src, size)]
                    return tirx.Select(inside, data[tuple(safe)], value[0])
                if mode == "edge":
                    idx = [tirx.Min(tirx.Max(s, zero), d - one) for s, d in zip(src, size)]
                elif mode == "reflect":
                    idx = [tirx.Select(s < zero, zero - s, tirx.Select(s >= d, two * (d - one) - s, s))
                           for s, d in zip(src, size)]
                elif mode == "wrap":
                    idx = [tirx.floormod(s, d) for s, d in zip(src, size)]
                else:
                    raise ValueError(f"unknown Pad mode '{mode}'")
                return data[tuple(idx)]

            return te.compute(out_shape, at, name="pad")

        return bb.emit_te(kernel, x, before, cval)


@register("Split")
class Split:
    """Split (opset 13+) with `split` sizes fed at run time: the number of outputs is the node's,
    each output's length along `axis` is bound to a symbolic var and its offset (an exclusive
    prefix sum) read from a tensor in the kernel. Constant sizes: TVM's converter."""

    @classmethod
    def get_converter(cls, opset):
        base = tvm_converter("Split", opset)

        def convert(bb, inputs, attr, params):
            # TVM splits into as many parts as the node has outputs; opset 18's num_outputs
            # must say the same, or the model means something else
            parts, outputs = attr.get("num_outputs"), attr["tvm_custom"]["num_outputs"]
            if parts is not None and parts != outputs:
                raise ValueError(f"num_outputs={parts}, but the node has {outputs} outputs")
            if opset < 13 or len(inputs) < 2 or not is_run_time(inputs[1], params):
                return base(bb, inputs, attr, params)
            return cls._run_time(bb, inputs[0], _operand(inputs[1], params), attr)

        return convert

    @staticmethod
    def _run_time(bb, x, split, attr):
        import numpy as np
        from tvm import relax, te, tirx

        rank = x.ty.ndim
        axis = int(attr.get("axis", 0))
        axis = axis + rank if axis < 0 else axis
        n = _static_len(split, "split")
        if n != attr["tvm_custom"]["num_outputs"]:
            raise ValueError(f"split has {n} sizes for {attr['tvm_custom']['num_outputs']} outputs")
        sizes = bb.emit(relax.op.astype(split, "int64"))
        offsets = bb.emit(relax.op.sum(relax.op.multiply(
            _i64(np.tril(np.ones((n, n)), -1)), relax.op.expand_dims(sizes, 0)), [1]))
        sizes = run_time_checks.checked_sizes(bb, sizes, run_time_checks.site(1, "split"),
                                              "split", base=relax.op.strided_slice(
                                                  _dims_tensor(bb, x), [0], [axis], [axis + 1]))
        lengths = shape_vars(bb, sizes, n, "split_", check=None)
        outs = []
        for k in range(n):
            shape = list(x.ty.shape)
            shape[axis] = lengths[k]

            def part(data, off, k=k, shape=shape):
                def at(*i):
                    idx = list(i)
                    idx[axis] = tirx.Cast("int64", i[axis]) + off[k]
                    return data[tuple(idx)]

                return te.compute(shape, at, name=f"split{k}")

            outs.append(bb.emit_te(part, x, offsets))
        return relax.Tuple(outs)


def _scan_run_time_axis(op_type: str):
    """CumSum/CumProd with the axis fed at run time: the output shape does not depend on it, so
    the scan is emitted along every axis and the one named at run time selected (rank scans:
    cheap for the small ranks where this occurs; a constant axis emits one)."""
    from . import reduce

    def convert(bb, inputs, attr, params):
        import numpy as np
        from tvm import relax

        if not is_run_time(inputs[1], params):
            return reduce._scan(bb, [inputs[0], _operand(inputs[1], params)], attr, op_type)
        x, axis = inputs[0], relax.op.astype(inputs[1], "int64")
        rank = x.ty.ndim
        axis = bb.emit(relax.op.where(relax.op.less(axis, _i64(0)),
                                      relax.op.add(axis, _i64(rank)), axis))
        out = None
        for k in range(rank):
            scan = reduce._scan(bb, [x, relax.const(np.array(k, "int64"), "int64")], attr, op_type)
            out = scan if out is None else bb.emit(
                relax.op.where(relax.op.equal(axis, _i64(k)), scan, out))
        return out

    return convert


@register("CumSum")
class CumSum:
    """CumSum with reverse/exclusive; axis constant or fed at run time."""

    @classmethod
    def get_converter(cls, opset):
        return _scan_run_time_axis("CumSum")


@register("CumProd")
class CumProd:
    """CumProd with reverse/exclusive; axis constant or fed at run time."""

    @classmethod
    def get_converter(cls, opset):
        return _scan_run_time_axis("CumProd")


@register("TopK")
class TopK:
    """TopK (opset 10+) through TOPI (relax.op.topk has no llvm legalization here, so TVM's
    converter failed to build even with a constant k). With k fed at run time: a full sort
    along the (static) axis, then the first k values and indices, k bound to a symbolic var."""

    @classmethod
    def get_converter(cls, opset):
        if opset < 10:
            return tvm_converter("TopK", opset)
        return cls._convert

    @staticmethod
    def _convert(bb, inputs, attr, params):
        from tvm import relax, te, tirx, topi

        x = inputs[0]
        rank = x.ty.ndim
        axis = int(attr.get("axis", -1))
        axis = axis + rank if axis < 0 else axis
        if attr.get("sorted", 1) != 1:
            raise ValueError("TopK sorted=0 is not supported")
        ascend = not bool(attr.get("largest", 1))
        dtype = str(x.ty.dtype)
        x = _sortable(bb, x)
        if not is_run_time(inputs[1], params):
            k = int(_operand(inputs[1], params).value.numpy().reshape(-1)[0])
            both = bb.emit_te(topi.topk, x, k, axis, "both", ascend, "int64")
            return relax.Tuple([_unsortable(bb, bb.emit(relax.TupleGetItem(both, 0)), dtype),
                                bb.emit(relax.TupleGetItem(both, 1))])
        n = x.ty.shape[axis]
        if not isinstance(n, (int, tirx.IntImm)):
            raise ValueError(f"TopK with k fed at run time needs a static dim {axis}")
        both = bb.emit_te(topi.topk, x, int(n), axis, "both", ascend, "int64")
        both = relax.Tuple([_unsortable(bb, bb.emit(relax.TupleGetItem(both, 0)), dtype),
                            bb.emit(relax.TupleGetItem(both, 1))])
        (kv,) = shape_vars(bb, bb.emit(relax.op.reshape(relax.op.astype(inputs[1], "int64"),
                                                        [1])), 1, "topk_k", high=int(n),
                           where=run_time_checks.site(1, "K"))
        shape = list(x.ty.shape)
        shape[axis] = kv

        def head(data):
            return te.compute(shape, lambda *i: data[i], name="topk_head")

        values = bb.emit_te(head, both[0])
        indices = bb.emit_te(head, both[1])
        return relax.Tuple([values, indices])


# Element types TVM's sort library (tvm.contrib.sort, what topi.topk calls on CPU) orders
# directly; the others are sorted as a wider type with the same order and converted back.
_SORT_DTYPES = {"float16", "float32", "float64", "int8", "uint8", "int32", "int64"}
_SORT_AS = {"int16": "int64", "uint16": "int64", "uint32": "int64", "bool": "uint8",
            "bfloat16": "float32"}
_UINT64_BIAS = 1 << 63


def _sortable(bb, x):
    """`x` as a type the sort library takes, in the same order (lossless for every value)."""
    from tvm import relax, te, tirx

    dtype = str(x.ty.dtype)
    if dtype in _SORT_DTYPES:
        return x
    if dtype in _SORT_AS:
        return bb.emit(relax.op.astype(x, _SORT_AS[dtype]))
    if dtype == "uint64":
        # flipping the top bit maps unsigned order onto signed order
        def flip(a):
            bias = tirx.const(_UINT64_BIAS, "uint64")
            return te.compute(a.shape, lambda *i: tirx.reinterpret("int64", a[i] ^ bias),
                              name="topk_u64_key")

        return bb.emit_te(flip, x)
    raise ValueError(f"TopK of {dtype} values is not supported")


def _unsortable(bb, values, dtype: str):
    """Values from `_sortable`'s type back to `dtype`."""
    from tvm import relax, te, tirx

    if str(values.ty.dtype) == dtype:
        return values
    if dtype == "uint64":
        def unflip(a):
            bias = tirx.const(_UINT64_BIAS, "uint64")
            return te.compute(a.shape, lambda *i: tirx.reinterpret("uint64", a[i]) ^ bias,
                              name="topk_u64_value")

        return bb.emit_te(unflip, values)
    return bb.emit(relax.op.astype(values, dtype))


@register("OneHot")
class OneHot:
    """OneHot (opset 9+) with depth fed at run time: depth bound to a symbolic var, the kernel
    compares each index (negative ones count from depth) with its position. Constant depth:
    TVM's converter."""

    @classmethod
    def get_converter(cls, opset):
        base = tvm_converter("OneHot", opset)

        def convert(bb, inputs, attr, params):
            if not is_run_time(inputs[1], params):
                return base(bb, inputs, attr, params)
            return cls._run_time(bb, inputs, attr)

        return convert

    @staticmethod
    def _run_time(bb, inputs, attr):
        from tvm import relax, te, tirx

        indices, depth, values = inputs[0], inputs[1], inputs[2]
        rank = indices.ty.ndim + 1
        axis = int(attr.get("axis", -1))
        axis = axis + rank if axis < 0 else axis
        depth = bb.emit(relax.op.reshape(relax.op.astype(depth, "int64"), [1]))
        (dv,) = shape_vars(bb, depth, 1, "onehot_depth", check="tile", low=1,
                           where=run_time_checks.site(1, "depth"),
                           base=relax.op.reshape(relax.op.prod(_dims_tensor(bb, indices)), [1]))
        shape = list(indices.ty.shape)
        shape.insert(axis, dv)

        def kernel(idx, vals):
            def at(*i):
                src = list(i[:axis]) + list(i[axis + 1:])
                v = tirx.Cast("int64", idx[tuple(src)])
                v = tirx.Select(v < tirx.const(0, "int64"), v + dv, v)
                return tirx.Select(v == tirx.Cast("int64", i[axis]), vals[1], vals[0])

            return te.compute(shape, at, name="one_hot")

        return bb.emit_te(kernel, indices, values)


@register("AffineGrid")
class AffineGrid:
    """AffineGrid with `size` fed at run time: its spatial dims are bound to symbolic vars and
    the grid is computed over them (relax's affine_grid legalizes only a static size). The batch
    comes from theta. A constant size uses TVM's converter."""

    @classmethod
    def get_converter(cls, opset):
        base = tvm_converter("AffineGrid", opset)

        def convert(bb, inputs, attr, params):
            from tvm import relax

            theta, size = inputs[0], inputs[1]
            if not is_run_time(size, params):
                return base(bb, inputs, attr, params)
            n = _static_len(size, "size")
            if n not in (4, 5):
                raise ValueError(f"AffineGrid's size must hold 4 (N, C, H, W) or 5 (N, C, D, H, "
                                 f"W) values, it holds {n}")
            dims = shape_vars(bb, bb.emit(relax.op.astype(size, "int64")), n, "grid_")
            align = bool(attr.get("align_corners", 0))
            return bb.emit_te(_affine_grid, theta, dims[2:], align)

        return convert


def _affine_grid(theta, spatial, align_corners: bool):
    """grid[n, *p, i] = sum_j theta[n, i, j] * (x_W, y_H, [z_D,] 1)[j] at output point p, the
    coordinates normalized to [-1, 1] as ONNX defines (pixel centres, or corners when aligned)."""
    from tvm import te, tirx

    dtype = theta.dtype
    k = len(spatial)  # 2 (H, W) or 3 (D, H, W)

    def coord(i, size):
        i, size = i.astype(dtype), size.astype(dtype)
        if not align_corners:
            return (2 * i + 1) / size - 1
        # one point sits at -1 (numpy.linspace(-1, 1, 1)), not at 0/0
        return tirx.Select(size > 1, 2 * i / tirx.max(size - 1, 1) - 1, tirx.const(-1, dtype))

    def value(n, *rest):
        p, out = rest[:k], rest[k]
        base = [coord(p[k - 1 - j], spatial[k - 1 - j]) for j in range(k)]  # x, y, [z]
        acc = theta[n, out, k]
        for j in range(k):
            acc = acc + theta[n, out, j] * base[j]
        return acc

    shape = [theta.shape[0], *spatial, k]
    return te.compute(shape, value, name="affine_grid")
