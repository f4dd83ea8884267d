"""Checks on values that come from a request: indices and sizes read from model inputs.

An index or size the graph reads from its inputs addresses memory: TVM's gather/scatter kernels
read and write `data[index]` unchecked ("fast" mode), and a size becomes an allocation. Each such
operand goes through a small check kernel first, which reads it once (normalizing negative
indices the ONNX way as it goes) and, where a value is out of range, calls the packed function
`HANDLER` with the site's description and the value. The kernel is compiled into the artifact;
only the failure path calls out, so a run in range pays one pass over the operand and nothing
else. Every runtime that loads artifacts registers `HANDLER` (tvmopt.runtime in Python, the edge
bundle's runner and RPC server in C++) and turns the call into an error of that call: the
artifact stays loaded and answers the next request.

A check is a PrimFunc with the attribute `CHECK_ATTR` (its description): `listed(mod)` is what
the manifest says remains at run time. Operands known at compile time are checked there instead.
"""

from __future__ import annotations

import contextlib
import threading

# The packed function a failing check calls: (kind, where, value, low, high, position).
HANDLER = "tvmopt.run_time_check_failed"
# The PrimFunc attribute naming a check kernel's site (what the manifest lists).
CHECK_ATTR = "tvmopt.run_time_check"
# The largest tensor (in elements) a size read from an input may ask for, unless the compile
# says otherwise (`compile --max-elements`): 2^31 elements is 8 GiB of float32.
DEFAULT_MAX_ELEMENTS = 1 << 31

_state = threading.local()
_registered: list = []  # non-empty once register_handler() ran in this process


@contextlib.contextmanager
def limits(max_elements: int | None, enabled: bool = True):
    """The element limit that size checks emitted inside this block compile in; with
    `enabled` False none are emitted (a CUDA build: the check kernels run on the host and
    cannot read the device's tensors)."""
    old = getattr(_state, "max_elements", None), getattr(_state, "disabled", False)
    _state.max_elements = max_elements or DEFAULT_MAX_ELEMENTS
    _state.disabled = not enabled
    try:
        yield
    finally:
        _state.max_elements, _state.disabled = old


def for_device(device: str, max_elements: int | None = None):
    """`limits` for an import that builds for `device`: checks on a CPU only (the check kernels
    run on the host: a CUDA build's tensors are on the device). Compile and tune import alike,
    so that tune's tasks are compile's."""
    return limits(max_elements, enabled=device == "cpu")


def max_elements() -> int:
    return getattr(_state, "max_elements", None) or DEFAULT_MAX_ELEMENTS


def enabled() -> bool:
    """Whether checks are emitted (see `limits`)."""
    return not getattr(_state, "disabled", False)


@contextlib.contextmanager
def at_node(name: str, op_type: str, inputs: list[str]):
    """The ONNX node being converted: what `site()` names in the checks emitted meanwhile."""
    old = getattr(_state, "node", None)
    _state.node = (name, op_type, list(inputs))
    try:
        yield
    finally:
        _state.node = old


def site(position: int | None = None, operand: str | None = None) -> str:
    """The node being converted (and one of its inputs), as a check's error names it."""
    name, op_type, _ = getattr(_state, "node", None) or ("?", "?", [])
    if position is None:
        return f"node '{name}' ({op_type})"
    return f"node '{name}' ({op_type}): {operand_label(position, operand)}"


def operand_label(position: int, operand: str | None = None) -> str:
    """One input of the node being converted: its name in the spec and the model's tensor."""
    _, _, inputs = getattr(_state, "node", None) or ("?", "?", [])
    operand = operand or f"#{position}"
    tensor = inputs[position] if position < len(inputs) else None
    shown = f" ('{tensor}')" if tensor and tensor != operand else ""
    return f"input '{operand}'{shown}"


def _index_kernel(dtype: str, where: str, negative: bool, rank: int, coords: int):
    """PrimFunc(idx, bounds [coords] int64) -> out, idx and out of the indices' own `rank`
    (no reshape around the check: a copy, and another task for tuning): out = idx with
    negative values counted from the end (where `negative`), every value checked against
    [-bound, bound) ([0, bound) without `negative`); the first one outside calls HANDLER.
    With coords > 1 the last axis holds each index tuple's coordinates (bounds[j] for the
    j-th); else every value is checked against bounds[0]."""
    import tvm
    from tvm.script import tirx

    low = "-n" if negative else "T.int64(0)"
    dims = [f"d{a}" for a in range(rank)]
    loops = [f"i{a}" for a in range(rank)]
    at = ", ".join(loops) if rank else "()"
    col = loops[-1] if coords > 1 else "T.int64(0)"
    flat = "T.int64(0)"
    for d, i in zip(dims, loops):
        flat = f"({flat}) * {d} + {i}"
    shape = "(" + "".join(f"{d}, " for d in dims) + ")"
    lines = ["@T.prim_func(private=True)",
             "def index_check(var_idx: T.handle, var_bounds: T.handle, var_out: T.handle):",
             f'    T.func_attr({{"tirx.noalias": True, "tirx.is_scheduled": True, '
             f'"op_pattern": 8, {CHECK_ATTR!r}: {where!r}}})',
             *[f"    {d} = T.int64()" for d in dims],
             f'    idx = T.match_buffer(var_idx, {shape}, "{dtype}")',
             f'    bounds = T.match_buffer(var_bounds, ({coords},), "int64")',
             f'    out = T.match_buffer(var_out, {shape}, "{dtype}")',
             '    bad = T.alloc_buffer((3,), "int64")',
             "    bad[0] = T.int64(0)"]
    pad = "    "
    if rank:
        lines.append(f"    for {', '.join(loops)} in T.grid({', '.join(dims)}):")
        pad = "        "
    lines += [f'{pad}v = T.Cast("int64", idx[{at}])',
              f"{pad}n = bounds[{col}]",
              f"{pad}if v < {low} or v >= n:",
              f"{pad}    if bad[0] == T.int64(0):",
              f"{pad}        bad[0] = T.int64(1)",
              f"{pad}        bad[1] = v",
              f'{pad}        bad[2] = T.Cast("int64", {flat})',
              f'{pad}out[{at}] = T.Cast("{dtype}", T.if_then_else(v < T.int64(0), v + n, v))',
              "    if bad[0] != T.int64(0):",
              f"        c = T.floormod(bad[2], T.int64({coords}))",
              f"        T.evaluate(T.call_packed({HANDLER!r}, \"index\", {where!r}, bad[1], "
              f"{'-bounds[c]' if negative else 'T.int64(0)'}, bounds[c] - T.int64(1), bad[2], "
              f"T.int64({coords})))"]
    return tvm.script.from_source("\n".join(lines), extra_vars={"T": tirx})


def checked_indices(bb, indices, bounds: list, where: str, negative: bool = True):
    """`indices` (any shape; the last axis holds the k coordinates when len(bounds) > 1) checked
    against `bounds` (k dims, ints or symbolic), negative ones normalized where `negative`.

    Returns the checked indices, same shape and dtype (non-negative, in range).
    """
    import numpy as np
    from tvm import relax, tirx

    dtype = str(indices.ty.dtype)
    if not enabled():
        return indices
    if indices.ty.ndim < 0:
        raise ValueError(f"{where}: indices of a rank unknown at compile time cannot be checked")
    if not isinstance(indices.ty.shape, relax.ShapeExpr):  # rank known, dims not: bind them
        dims = [tirx.Var(f"index_d{k}", "int64") for k in range(indices.ty.ndim)]
        indices = bb.match_cast(indices, relax.TensorType(dims, dtype))
    if all(isinstance(b, (int, tirx.IntImm)) for b in bounds):
        bnd = relax.const(np.array([int(b) for b in bounds], "int64"), "int64")
    else:
        bnd = bb.emit(relax.op.shape_to_tensor(relax.ShapeExpr(
            [b if not isinstance(b, int) else tirx.IntImm("int64", b) for b in bounds])))
    kernel = _index_kernel(dtype, where, negative, indices.ty.ndim, len(bounds))
    gv = bb.add_func(kernel, "index_check")
    return bb.emit(relax.call_tir(gv, [indices, bnd],
                                  out_ty=relax.TensorType(indices.ty.shape, dtype)))


def check_constant_indices(values, bounds: list[int], where: str, negative: bool = True):
    """Compile-time form of `checked_indices` for indices that are constants.

    Returns the normalized numpy array.

    Raises:
        ValueError: naming the value and its range.
    """
    import numpy as np

    a = np.asarray(values).astype(np.int64)
    k = len(bounds)
    flat = a.reshape(-1, k)
    b = np.asarray(bounds, np.int64)[None, :]
    low = -b if negative else np.zeros_like(b)
    bad = (flat < low) | (flat >= b)
    if bad.any():
        pos = int(np.argmax(bad.reshape(-1)))
        col = pos % k
        raise ValueError(f"{where}: index {int(flat.reshape(-1)[pos])} is outside "
                         f"[{int(low[0, col])}, {int(b[0, col]) - 1}]")
    return np.where(a < 0, a + np.broadcast_to(b.reshape(-1), flat.shape).reshape(a.shape), a) \
        if negative else a


# What a size check verifies, per value v (with b the matching value of its `base` operand):
SIZE_MODES = {
    "dims": 0,     # v >= low and v <= high; the output dims are the v
    "tile": 1,     # v >= low; the output dims are v * b (repeats of the input's dims)
    "expand": 2,   # v >= 0 and (v == 1 or b == 1 or v == b): numpy broadcasting against b
    "reshape": 3,  # v >= 0 and the product of the v equals base[0] (the input's element count)
    "nonzero": 4,  # v != 0 (a step, a delta); no output dims
    "split": 5,    # v >= 0 and the sum of the v equals base[0] (the split axis' length)
    "equal": 6,    # v == b (a length computed at run time against the one the graph assumed)
}


def _size_kernel(where: str, limit: int, n: int, mode: int, low: int, high: int):
    """PrimFunc(sizes [n] int64, base [n] int64) -> out [n] int64 (a copy of sizes), checking
    them by `mode` (SIZE_MODES) and the element count of the output dims against `limit`.
    The first violation calls HANDLER."""
    from tvm.script import tirx as T

    # a bound the caller gave (TopK's k <= the axis) is reported as the range; otherwise a
    # value past the limit is an element-count failure and the range has no top (-1)
    explicit_high = high != limit
    shown_high = high if explicit_high else -1

    @T.prim_func(private=True)
    def size_check(var_sizes: T.handle, var_base: T.handle, var_out: T.handle):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True, "op_pattern": 8,
                     CHECK_ATTR: where})
        sizes = T.match_buffer(var_sizes, (n,), "int64")
        base = T.match_buffer(var_base, (n,), "int64")
        out = T.match_buffer(var_out, (n,), "int64")
        # acc: [product or sum so far, failure kind (0 none), value, position, detail]
        acc = T.alloc_buffer((5,), "int64")
        acc[0] = T.int64(1) if mode != 5 else T.int64(0)
        acc[1] = T.int64(0)
        for i in range(n):
            v = sizes[i]
            b = base[i]
            out[i] = v
            if acc[1] == T.int64(0):
                if mode == 4:
                    if v == T.int64(0):
                        acc[1] = T.int64(1)
                        acc[2] = v
                        acc[3] = T.Cast("int64", i)
                elif v < T.int64(low) or v > T.int64(high):
                    acc[1] = T.if_then_else(v < T.int64(low) or explicit_high, T.int64(1),
                                            T.int64(3))
                    acc[2] = v
                    acc[3] = T.Cast("int64", i)
                elif mode == 6 and v != b:
                    acc[1] = T.int64(5)
                    acc[2] = v
                    acc[3] = T.Cast("int64", i)
                    acc[4] = b
                elif mode == 2 and v != T.int64(1) and b != T.int64(1) and v != b:
                    acc[1] = T.int64(2)
                    acc[2] = v
                    acc[3] = T.Cast("int64", i)
                    acc[4] = b
                elif mode == 5:
                    acc[0] = acc[0] + v
                else:
                    d = T.if_then_else(mode == 1, v * b, T.if_then_else(
                        mode == 2 and v == T.int64(1), b, v))
                    if d > T.int64(0):
                        if acc[0] > T.int64(limit) // d:
                            acc[1] = T.int64(3)
                            acc[2] = v
                            acc[3] = T.Cast("int64", i)
                        else:
                            acc[0] = acc[0] * d
                    else:
                        acc[0] = T.int64(0)
        if acc[1] == T.int64(0) and (mode == 3 or mode == 5) and acc[0] != base[0]:
            acc[1] = T.int64(4)
            acc[2] = acc[0]
            acc[3] = T.int64(0)
            acc[4] = base[0]
        if acc[1] == T.int64(1):
            T.evaluate(T.call_packed(HANDLER, "size" if mode != 4 else "nonzero", where, acc[2],
                                     T.int64(low), T.int64(shown_high), acc[3], T.int64(n)))
        if acc[1] == T.int64(2):
            T.evaluate(T.call_packed(HANDLER, "broadcast", where, acc[2], acc[4], acc[4],
                                     acc[3], T.int64(n)))
        if acc[1] == T.int64(3):
            T.evaluate(T.call_packed(HANDLER, "elements", where, acc[2], T.int64(0),
                                     T.int64(limit), acc[3], T.int64(n)))
        if acc[1] == T.int64(5):
            T.evaluate(T.call_packed(HANDLER, "equal", where, acc[2], acc[4], acc[4], acc[3],
                                     T.int64(n)))
        if acc[1] == T.int64(4):
            T.evaluate(T.call_packed(HANDLER, "reshape" if mode == 3 else "split", where,
                                     acc[2], acc[4], acc[4], T.int64(0), T.int64(n)))

    return size_check


def checked_sizes(bb, sizes, where: str | None = None, mode: str = "dims", base=None,
                  low: int = 0, high: int | None = None):
    """A 1-D int tensor of sizes read from the inputs (an output shape, repeats, a count, a
    step), checked by `mode` (SIZE_MODES) and the element count against the compile's limit.
    `base`: the values the mode compares with (a tensor of the same length, or a scalar for
    "reshape"/"split"), None for 1 each. `where`: the site (default: the node being converted).

    Returns the checked sizes as int64 (the same values); a tensor of unknown length is
    returned unchecked (its allocation still fails cleanly).
    """
    import numpy as np
    from tvm import relax, tirx

    sizes = bb.normalize(relax.op.astype(sizes, "int64"))
    if not enabled():
        return sizes
    shape = sizes.ty.shape
    if sizes.ty.ndim == 0:
        sizes = bb.normalize(relax.op.reshape(sizes, [1]))
        shape = sizes.ty.shape
    if sizes.ty.ndim != 1 or not isinstance(shape, relax.ShapeExpr) or \
            not isinstance(shape.values[0], tirx.IntImm):
        return sizes
    n = int(shape.values[0])
    if n == 0:
        return sizes
    if base is None:
        base = relax.const(np.ones(n, "int64"), "int64")
    base = bb.normalize(relax.op.astype(base, "int64"))
    if mode in ("reshape", "split"):  # one value to compare with: as base[0]
        base = bb.normalize(relax.op.broadcast_to(relax.op.reshape(base, [1]), [n]))
    limit = max_elements()
    gv = bb.add_func(_size_kernel(where or site(), limit, n, SIZE_MODES[mode], low,
                                  limit if high is None else high), "size_check")
    return bb.emit(relax.call_tir(gv, [sizes, base], out_ty=relax.TensorType([n], "int64")))


def listed(mod) -> list[str]:
    """The run-time checks in `mod` (their sites), sorted."""
    from tvm import tirx

    out = []
    for _, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and func.attrs is not None and CHECK_ATTR in func.attrs:
            out.append(str(func.attrs[CHECK_ATTR]))
    return sorted(out)


def message(kind: str, where: str, value: int, low: int, high: int, position: int,
            count: int) -> str:
    """The error text for a failed check (what HANDLER raises)."""
    if kind == "index":
        at = f" (coordinate {position % count} of an index tuple)" if count > 1 else ""
        return (f"{where}: index {value} is out of range: valid indices are "
                f"[{low}, {high}]{at}")
    if kind == "size":
        valid = f"{low}..{high}" if high >= low else f"at least {low}"
        return f"{where}: value {value} at position {position} is out of range ({valid})"
    if kind == "nonzero":
        return f"{where}: value {value} at position {position} must not be 0"
    if kind == "broadcast":
        return (f"{where}: value {value} at position {position} cannot broadcast with the "
                f"input's dim {low} (it must be 1, or equal it, or the dim must be 1)")
    if kind == "reshape":
        return (f"{where}: the shape holds {value} elements, the input {low}: "
                "they must be equal")
    if kind == "equal":
        return f"{where}: value {value} at position {position} must be {low}"
    if kind == "split":
        return f"{where}: the parts add up to {value}, the axis is {low} long: they must be equal"
    if kind == "elements":
        at = f"value {value} at position {position}" if count > 1 else f"value {value}"
        return (f"{where}: {at} asks for a tensor of more than {high} elements, the limit "
                "this artifact was compiled with (compile --max-elements)")
    return f"{where}: value {value} is out of range [{low}, {high}]"


def _raise(kind, where, value, low, high, position, count):
    from ..errors import InputValueError

    raise InputValueError(message(str(kind), str(where), int(value), int(low), int(high),
                                  int(position), int(count)))


def register_handler() -> None:
    """Register HANDLER in this process (idempotent): what a failing check calls."""
    import tvm_ffi

    if _registered:
        return
    from ..errors import InputValueError

    tvm_ffi.register_global_func(HANDLER, _raise, override=True)
    # so that the error crosses the VM and the kernel as itself, not as a RuntimeError
    tvm_ffi.register_error("InputValueError", InputValueError)
    _registered.append(True)


# Relax ops that address memory with an index operand (its position), for `check_index_ops`.
_INDEX_OPS = {"relax.take": 1, "relax.gather_elements": 1, "relax.gather_nd": 1,
              "relax.scatter_elements": 1, "relax.scatter_nd": 1}


# Ops that keep the elements and their order: indices read through them are the same values.
_ORDER_KEEPING = {"relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten"}


def addressed_dims(dims: list, axis: int | None = None, coords=None, start: int = 0):
    """The dims an index addresses, one per coordinate: [dims[axis]] for an op indexing one
    axis; dims[start:start + coords] for index tuples of `coords` coordinates from axis `start`
    (GatherND's batch_dims). None where that is not known at compile time or out of rank."""
    from tvm import tirx

    rank = len(dims)
    if axis is not None:
        axis = axis + rank if axis < 0 else axis
        return [dims[axis]] if 0 <= axis < rank else None
    if not isinstance(coords, (int, tirx.IntImm)):
        return None
    k = int(coords)
    return list(dims[start:start + k]) if start + k <= rank else None


def _op_bounds(call, data_dims, idx):
    """The dims each coordinate of `call`'s indices addresses, or None when unknown."""
    name = call.op.name
    if name in ("relax.take", "relax.gather_elements", "relax.scatter_elements"):
        if call.attrs.axis is None:  # take over the flattened data
            size = 1
            for d in data_dims:
                size = size * d
            return [size]
        return addressed_dims(data_dims, axis=int(call.attrs.axis))
    shape = idx.ty.shape
    coords = shape[-1] if shape is not None and idx.ty.ndim else None
    start = int(call.attrs.batch_dims) if name == "relax.gather_nd" else 0
    return addressed_dims(data_dims, coords=coords, start=start)


def check_index_ops(mod, origin: str):
    """Every gather/scatter/take in `mod` whose indices are not a constant gets them checked
    (in range [0, size): the program's own ops have normalized any negative index its
    semantics allow). For importers that do not check per node (the torch program's); `origin`
    names the program in the message.

    Raises:
        ValueError: an index op over data of unknown rank (its indices cannot be checked).
    """
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Checker(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.mod_ = mod

        def visit_call_(self, call):
            call = super().visit_call_(call)
            pos = _INDEX_OPS.get(getattr(call.op, "name", None))
            if pos is None or isinstance(call.args[pos], tvm.ir.GenericConst):
                return call
            data, idx = call.args[0], call.args[pos]
            ty = data.ty
            if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
                raise ValueError(f"{origin}: {call.op.name} over data of unknown rank: its "
                                 "indices cannot be checked")
            bounds = _op_bounds(call, list(ty.shape.values), idx)
            if bounds is None:
                raise ValueError(f"{origin}: {call.op.name}: the dims its indices address are "
                                 "unknown at compile time, so they cannot be checked")
            where = (f"{origin}, {call.op.name.split('.')[-1]} from {self._describe(data)}: "
                     f"indices {self._describe(idx)}")
            wide = self._before_narrowing(idx)
            if wide is None:
                checked = checked_indices(self.builder_, idx, bounds, where, negative=False)
            else:  # the indices as given, before a cast to int32 wrapped them into range
                checked = self.builder_.emit(relax.op.reshape(relax.op.astype(
                    checked_indices(self.builder_, wide, bounds, where, negative=False),
                    str(idx.ty.dtype)), idx.ty.shape))
            args = list(call.args)
            args[pos] = checked
            return relax.Call(call.op, args, call.attrs, call.ty_args, call.span)

        def _before_narrowing(self, idx):
            """The wider integer tensor `idx` was cast from (TVM's torch importer casts an
            embedding's int64 ids to int32 first), through reshapes only; None if none."""
            import numpy as np

            seen = idx
            for _ in range(16):
                bound = self.lookup_binding(seen) if isinstance(seen, relax.Var) else None
                if not isinstance(bound, relax.Call):
                    return None
                name = getattr(bound.op, "name", "")
                if name == "relax.astype":
                    src = bound.args[0]
                    have, want = str(src.ty.dtype), str(idx.ty.dtype)
                    wider = have.startswith(("int", "uint")) and \
                        np.dtype(have).itemsize > np.dtype(want).itemsize
                    return src if wider else None
                if name not in _ORDER_KEEPING:
                    return None
                seen = bound.args[0]
            return None

        def _describe(self, expr) -> str:
            """A model input the value comes from through casts and reshapes, by name;
            otherwise what it is."""
            seen = expr
            for _ in range(16):
                if not isinstance(seen, relax.Var):
                    break
                bound = self.lookup_binding(seen)
                if bound is None:
                    return f"'{seen.name}' (a model input)"
                if not isinstance(bound, relax.Call) or not bound.args:
                    break
                seen = bound.args[0]
            if isinstance(expr, tvm.ir.GenericConst) or isinstance(seen, tvm.ir.GenericConst):
                dims = expr.ty.shape.values if isinstance(expr.ty.shape, relax.ShapeExpr) else []
                shape = "x".join(str(int(d)) if hasattr(d, "value") else str(d) for d in dims)
                return f"a constant of shape {shape}"
            return "a value computed from the inputs"

        def transform(self):
            for gv, func in self.mod_.functions_items():
                if isinstance(func, relax.Function):
                    self.builder_.update_func(gv, self.visit_expr(func))
            return self.builder_.get()

    return _Checker(mod).transform() if enabled() else mod
