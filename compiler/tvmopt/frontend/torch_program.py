"""PyTorch in: `torch.export.save`d ExportedPrograms (.pt2) -> Relax, through TVM's importer.

The program's user inputs become the Relax function's parameters (names as `print(ep)` shows
them), parameters and buffers are bound as constants, and the symbols of `torch.export.Dim`
dimensions stay symbolic under torch's own names (`s0`, `s77`, ...), with the program's range
constraints as the function's bounds. `--shape` binds them to numbers instead.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

from ..errors import ImportFailure, ModelError, ShapeError, UnsupportedOpError, error_line
from ..tensor_info import TensorInfo

SUFFIXES = (".pt2",)
FORMAT = "torch.export"


def is_torch_program(path) -> bool:
    return Path(str(path)).suffix.lower() in SUFFIXES


@contextlib.contextmanager
def _quiet():
    """torch prints deprecation and pytree warnings on load and decomposition; they are torch's
    business, not the user's."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


_UNREGISTERED = re.compile(r"Deserializing ([\w.]+) in pytree is not registered")


def load_program(path):
    """Load a `torch.export.save`d ExportedProgram.

    An output class the program's output structure names (a transformers ModelOutput, say) has
    to be registered with torch's pytree before loading: its module is imported when it is
    installed, as the exporting process had it.

    Raises:
        ModelError: the file is missing, empty, truncated or not an ExportedProgram archive.
    """
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: no such file")
    if p.is_dir():
        raise ModelError(f"{p}: is a directory, expected a .pt2 file")
    if p.stat().st_size == 0:
        raise ModelError(f"{p}: file is empty")
    import torch

    tried: set[str] = set()
    while True:
        try:
            with _quiet(), _torch_log() as log:
                ep = torch.export.load(str(p))
            break
        except Exception as err:  # zipfile, pickle, torch's own serialization errors
            detail = "\n".join([*log, str(err)])
            found = _UNREGISTERED.search(detail)
            module = found.group(1).rsplit(".", 1)[0] if found else None
            if module and module not in tried and _import_quietly(module):
                tried.add(module)
                continue
            causes = [ln.strip() for ln in detail.splitlines()
                      if re.match(r"\s*\w+(Error|Exception|NotImplementedError):", ln)]
            reason = (causes[-1] if causes else
                      f"{type(err).__name__}: {error_line(err)[:300]}").split(". ")[0][:240]
            if found:
                raise ModelError(f"{p}: its outputs are {found.group(1)}, which is not "
                                 f"registered with torch's pytree here (is the package that "
                                 "defines it installed?)") from None
            raise ModelError(f"{p}: not a loadable torch.export program ({reason}); is it "
                             "truncated, or saved with something other than "
                             "torch.export.save?") from None
    if not isinstance(ep, torch.export.ExportedProgram):
        raise ModelError(f"{p}: holds a {type(ep).__name__}, not a torch.export ExportedProgram")
    return ep


@contextlib.contextmanager
def _torch_log():
    """torch.export.load logs why deserializing failed (with a traceback) and raises a generic
    error: keep the log for the one-line message instead of printing it."""
    import logging

    records: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record):
            records.append(logging.Formatter().format(record))  # with its traceback

    logger = logging.getLogger("torch.export")  # torch gives it a stderr handler of its own
    handlers, propagate = list(logger.handlers), logger.propagate
    logger.handlers, logger.propagate = [_Keep()], False
    try:
        yield records
    finally:
        logger.handlers, logger.propagate = handlers, propagate


def _import_quietly(module: str) -> bool:
    import importlib

    try:
        with _quiet():
            importlib.import_module(module)
        return True
    except ImportError:  # not installed: the caller says the class is not registered
        return False
    except Exception as err:  # noqa: BLE001 - a package's own import code raises any type
        warnings.warn(f"tvmopt: importing {module} failed: {error_line(err)[:200]}")
        return False


# ---------------------------------------------------------------------------- signature
def _dtype(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dim(d):
    import torch

    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        return int(expr) if expr.is_number else str(expr)
    return int(d)


def _tensor_info(name: str, val) -> TensorInfo:
    import torch

    if not isinstance(val, torch.Tensor):
        raise ImportFailure(f"'{name}' is a {type(val).__name__}, not a tensor; only tensor "
                            "inputs and outputs are supported (export with tensors only)")
    return TensorInfo(name, tuple(_dim(d) for d in val.shape), _dtype(val.dtype))


def _user_input_nodes(ep) -> list:
    from torch.export.graph_signature import InputKind

    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    by_name = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    return [by_name[n] for n in names]


def program_inputs(ep) -> list[TensorInfo]:
    """The user inputs: names, shapes (symbols as strings) and dtypes."""
    return [_tensor_info(n.name, n.meta.get("val")) for n in _user_input_nodes(ep)]


def output_names(ep) -> list[str]:
    """One name per flat output, from the program's output structure: a dict or dataclass
    output (a transformers ModelOutput) keeps its keys, a single tensor is 'output', a tuple
    gives output_0, output_1, ..."""
    from torch.utils import _pytree as pytree

    n = len(ep.graph_signature.user_outputs)
    try:
        spec = ep.call_spec.out_spec
        leaves = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(n)), spec))[0]
    except (TypeError, ValueError):  # no spec, or one that does not hold n leaves: plain names
        leaves = []
    if len(leaves) != n:
        return list(ep.graph_signature.user_outputs)
    names = []
    for path, _ in leaves:
        parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        if not parts:
            names.append("output")
        elif parts[0].isdigit():
            names.append("_".join(["output", *parts]))
        else:
            names.append(".".join(parts))
    return names if len(set(names)) == n else list(ep.graph_signature.user_outputs)


def program_outputs(ep) -> list[TensorInfo]:
    out = next(n for n in ep.graph.nodes if n.op == "output")
    from torch.export.graph_signature import OutputKind

    kinds = [s.kind for s in ep.graph_signature.output_specs]
    vals = [a.meta.get("val") if hasattr(a, "meta") else a for a in out.args[0]]
    vals = [v for v, k in zip(vals, kinds) if k in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT)]
    return [_tensor_info(name, v) for name, v in zip(output_names(ep), vals)]


# ---------------------------------------------------------------------------- import
def _decompose(ep, convert_map=None):
    """Core ATen, as TVM's importer expects (what `from_exported_program` does by default).

    A loaded program with derived dims (`8 * h`) is first cleared of the ranges torch's loader
    files under them (_symbol_keyed_ranges), or torch cannot re-trace it. Some of torch's
    decompositions fail on programs with symbolic dims (a `view` of a non-contiguous attention
    output). Then the ops TVM's importer converts as they are (`convert_map`: linear,
    scaled_dot_product_attention, upsampling, ...) are left whole and only the rest decomposed.
    (Taking a program that torch cannot re-trace at all as exported, in training IR, gave wrong
    results on a DeepLabV3: it stays refused.)
    """
    def refused(err):
        return ImportFailure(f"torch could not decompose the program to core ATen: "
                             f"{error_line(err)[:300]}")

    _symbol_keyed_ranges(ep)
    # torch's tracer and decompositions raise any type on a program they cannot take.
    try:
        with _quiet():
            return ep.run_decompositions()
    except Exception as err:  # noqa: BLE001 - retried below with TVM's own ops left whole
        if not convert_map:
            raise refused(err) from None
        first = err
    import torch

    table = {op: fn for op, fn in torch.export.default_decompositions().items()
             if getattr(op, "__name__", str(op)) not in convert_map}
    try:
        with _quiet():
            return ep.run_decompositions(table)
    except Exception:  # noqa: BLE001 - the first failure is the one to report
        raise refused(first) from None


def _symbol_keyed_ranges(ep) -> None:
    """Drop the ranges that `torch.export.load` files under derived dims in the program's
    ShapeEnv. Deserializing a program exported with `8 * Dim` constrains the expression
    `8*s26` itself (torch's `_parse_sym_expr` calls `constrain_symbol_range` on every
    sub-expression that has a saved range), so `var_to_range` holds a key that is no symbol
    and re-tracing (run_decompositions) stops at "expected sympy.Symbol". The range of a
    derived dim follows from its root's, which stays: the program is unchanged."""
    import sympy

    try:
        from torch._export.utils import _get_shape_env_from_gm
    except ImportError:  # a private torch helper, gone in this torch: nothing to clean
        return
    shape_env = _get_shape_env_from_gm(ep.graph_module)
    for table in ("var_to_range", "var_to_range_sloc"):
        ranges = getattr(shape_env, table, None)
        if isinstance(ranges, dict):
            for key in [k for k in ranges if not isinstance(k, sympy.Symbol)]:
                del ranges[key]


def _op_name(node) -> str:
    return getattr(node.target, "__name__", str(node.target))


def unsupported_ops(ep, convert_map) -> dict[str, list[str]]:
    """ATen ops TVM's importer has no converter for, each with the names of the nodes using it."""
    missing: dict[str, list[str]] = {}
    for node in ep.graph.nodes:
        if node.op == "call_function" and _op_name(node) not in convert_map:
            missing.setdefault(_op_name(node), []).append(node.name)
    return missing


def _unsupported_message(missing: dict[str, list[str]]) -> str:
    parts = []
    for op, nodes in sorted(missing.items()):
        shown = ", ".join(nodes[:3]) + (f" (+{len(nodes) - 3} more)" if len(nodes) > 3 else "")
        parts.append(f"{op} (nodes: {shown})")
    return "unsupported torch ops: " + "; ".join(parts)


def _naming_converters(importer) -> None:
    """Make a converter's failure name the node and op it was converting."""

    def wrap(op, fn):
        def convert(node, *rest):
            try:
                return fn(node, *rest)
            except (ImportFailure, ShapeError, UnsupportedOpError):
                raise
            except Exception as err:
                raise ImportFailure(f"node '{node.name}' ({op}): "
                                    f"{error_line(err)[:300]}") from None

        return convert

    importer.convert_map = {k: wrap(k, v) for k, v in importer.convert_map.items()}


def _cat_skips_empty(importer) -> None:
    """torch.cat skips 1-d empty tensors beside tensors of any rank (a legacy rule that
    transformers' KV caches rely on: a layer's cache starts as `torch.tensor([])` and grows by
    `cat`); TVM's converter refuses the mixed ranks, so those inputs are dropped first."""
    for op in ("cat.default", "concat.default"):
        fn = importer.convert_map.get(op)
        if fn is None:
            continue

        def convert(node, *rest, _fn=fn):
            parts = node.args[0] if node.args else None
            if isinstance(parts, (list, tuple)) and len(parts) > 1:
                def empty_1d(p):
                    val = getattr(p, "meta", {}).get("val")
                    shape = getattr(val, "shape", None)
                    return shape is not None and len(shape) == 1 and shape[0] == 0

                kept = [p for p in parts if not empty_1d(p)]
                if kept and len(kept) < len(parts):
                    node.args = (kept, *node.args[1:])
            return _fn(node, *rest)

        importer.convert_map[op] = convert


def _relax_dim(dim, syms: dict):
    """A torch dim (int or SymInt) as a TIR expression over the importer's dim vars, or None
    when it names a symbol the inputs do not define or is not a sum/product of them."""
    import sympy
    import torch
    from tvm import tirx

    if not isinstance(dim, torch.SymInt):
        return tirx.IntImm("int64", int(dim))

    def conv(e):
        if isinstance(e, sympy.Integer):
            return tirx.IntImm("int64", int(e))
        if isinstance(e, sympy.Symbol):
            return syms.get(str(e))
        if isinstance(e, (sympy.Add, sympy.Mul)):
            terms = [conv(a) for a in e.args]
            if any(t is None for t in terms):
                return None
            out = terms[0]
            for t in terms[1:]:
                out = out + t if isinstance(e, sympy.Add) else out * t
            return out
        return None

    return conv(dim.node.expr)


def _torch_shapes_for_slices(importer) -> None:
    """A slice whose end is a symbolic size (`position_ids[:, :seq]`, a causal mask cut to the
    key length) has, in TVM's converter, the length `min(seq, table size)`: it no longer
    broadcasts against `seq` and everything downstream loses its shape ("emit_te now only
    supports Tensor that has ShapeExpr shape"). torch has already shown the slice in bounds
    with the program's range constraints (`seq <= table size`, its output shape is `seq`):
    the slice is then emitted again with `assume_inbound`, whose length is `end - start`, and
    kept when that is torch's shape. (A match_cast to torch's shape instead crashed TVM's
    CanonicalizeBindings.)"""
    import tvm.ir.prim
    from tvm import relax
    from torch import fx

    fn = importer.convert_map.get("slice.Tensor")
    if fn is None:
        return

    def arg(node, i, default):
        v = node.args[i] if len(node.args) > i else default
        v = importer.env[v] if isinstance(v, fx.Node) else v
        return default if v is None else v

    def convert(node, *rest):
        out = fn(node, *rest)
        val = getattr(node, "meta", {}).get("val")
        shape = getattr(getattr(getattr(out, "ty", None), "shape", None), "values", None)
        if val is None or shape is None or len(shape) != len(val.shape):
            return out
        want = [_relax_dim(d, _known_syms(importer)) for d in val.shape]
        if any(w is None for w in want) or all(
                tvm.ir.prim.expr_deep_equal(w, s) for w, s in zip(want, shape)):
            return out
        x = importer.env[node.args[0]]
        rank = len(x.ty.shape.values)
        dim = arg(node, 1, 0) % rank
        start, end, step = arg(node, 2, 0), arg(node, 3, None), arg(node, 4, 1)
        if end is None or not isinstance(step, int):
            return out
        inbound = importer.block_builder.normalize(relax.op.strided_slice(
            x, [dim], [start], [end], [step], assume_inbound=True))
        got = inbound.ty.shape.values
        if all(tvm.ir.prim.expr_deep_equal(w, g) for w, g in zip(want, got)):
            return importer.block_builder.emit(inbound)
        return out

    importer.convert_map["slice.Tensor"] = convert


# Elementwise ATen ops whose tensor operands broadcast against each other (numpy rules).
_BROADCASTING_OPS = (
    "add", "add.Tensor", "add_.Tensor", "sub", "sub.Tensor", "rsub.Tensor", "mul", "mul.Tensor",
    "mul_.Tensor", "div.Tensor", "div.Tensor_mode", "floor_divide.default", "fmod.Tensor",
    "remainder.Tensor", "pow.Tensor_Tensor", "atan2.default", "maximum.default",
    "minimum.default", "eq", "eq.Tensor", "ne", "ne.Tensor", "lt", "lt.Tensor", "le",
    "le.Tensor", "gt", "gt.Tensor", "ge", "ge.Tensor", "logical_and.default",
    "logical_or.default", "logical_xor.default", "bitwise_and.Tensor", "bitwise_or.Tensor",
    "bitwise_xor.Tensor", "where.self", "masked_fill.Scalar", "clamp.Tensor")


def _agreeing_broadcasts(importer) -> None:
    """Operands of a broadcasting op whose equal dims are spelled two ways keep a known shape.

    wav2vec2's positional convolution pads by 8 and drops the last frame: its length is a
    slice's `min(max(n + 1, 0), n + 2)` over the feature encoder's `n = (s - 105) // 80`,
    while the residual it is added to carries torch's `1 + ((s // 5 - 9) // 4 - 3) // 4`.
    Relax cannot prove them equal, so the sum (and the LayerNorm after it) lost its shape
    ("emit_te now only supports Tensor that has ShapeExpr shape"). torch has checked that
    the operands broadcast, so they are asserted to one spelling (shape_values'
    agree_broadcast_dims, as the ONNX importer does; checked when the artifact runs).
    """
    from torch import fx

    from .onnx_ops.shape_values import agree_broadcast_dims

    def wrap(fn):
        def convert(node, *rest):
            args = [a for a in node.args if isinstance(a, fx.Node) and a in importer.env]
            vals = [importer.env[a] for a in args]
            for a, v, w in zip(args, vals, agree_broadcast_dims(importer.block_builder, vals)):
                if w is not v:
                    importer.env[a] = w
            return fn(node, *rest)
        return convert

    for op in _BROADCASTING_OPS:
        if op in importer.convert_map:
            importer.convert_map[op] = wrap(importer.convert_map[op])


def _known_syms(importer) -> dict:
    """Name -> TIR var of every dim var the program's inputs carry (read once: the inputs are
    in the importer's env before the first node is converted)."""
    import tvm
    from tvm import tirx

    syms = getattr(importer, "_tvmopt_syms", None)
    if syms:
        return syms
    syms = importer._tvmopt_syms = {}
    for val in importer.env.values():
        shape = getattr(getattr(val, "ty", None), "shape", None)
        for dim in getattr(shape, "values", None) or []:
            if tvm.ir.is_prim_expr(dim):  # a var, or a derived dim such as 8 * h
                for v in tirx.analysis.undefined_vars(dim, []):
                    syms.setdefault(v.name, v)
    return syms


def _symbolic_repeat(importer) -> None:
    """`x.repeat(batch, 1, 1)` by a run-time count (DETR's queries over the batch): TVM's
    converter takes static counts only. Tiling is a broadcast of x with a unit axis before each
    of its axes, to (count, size) pairs, then a reshape to torch's output shape."""
    from tvm import relax, tirx

    fn = importer.convert_map.get("repeat.default")
    if fn is None:
        return

    def convert(node, *rest):
        reps = node.args[1] if len(node.args) > 1 else ()
        val = getattr(node, "meta", {}).get("val")
        if all(isinstance(r, int) for r in reps) or val is None:
            return fn(node, *rest)
        x = importer.env[node.args[0]]
        in_shape = list(x.ty.shape.values)
        out = [_relax_dim(d, _known_syms(importer)) for d in val.shape]
        if any(o is None for o in out) or len(out) < len(in_shape):
            return fn(node, *rest)
        one = tirx.IntImm("int64", 1)
        padded = [one] * (len(out) - len(in_shape)) + in_shape
        bb = importer.block_builder
        pairs = bb.emit(relax.op.reshape(x, [e for d in padded for e in (one, d)]))
        wide = bb.emit(relax.op.broadcast_to(pairs, [e for d, o in zip(padded, out)
                                                      for e in (tirx.floordiv(o, d), d)]))
        return bb.emit(relax.op.reshape(wide, out))

    importer.convert_map["repeat.default"] = convert


def _attention_as_matmuls(importer) -> None:
    """scaled_dot_product_attention, where it reaches the importer whole (torch's
    decomposition of it failed: GPT-2's attention under torch.export), as the matmul /
    softmax / matmul that the rest of the pipeline schedules: TVM's converter makes a fused
    `nn.attention` whose LLVM code generation did not finish with symbolic lengths, takes 4-d
    float masks only and drops `scale`. A boolean mask (True: attend) and `is_causal` mask
    with the dtype's lowest value, as transformers does; float masks are added."""
    import math

    import numpy as np
    from torch import fx
    from tvm import relax

    op = "scaled_dot_product_attention.default"
    if op not in importer.convert_map:
        return

    def opt(node, i, name, default):
        return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)

    def convert(node, *rest):
        bb, env = importer.block_builder, importer.env
        q, k, v = (env[a] for a in node.args[:3])
        mask, dropout = opt(node, 3, "attn_mask", None), opt(node, 4, "dropout_p", 0.0)
        causal, scale = opt(node, 5, "is_causal", False), opt(node, 6, "scale", None)
        if dropout or node.kwargs.get("enable_gqa"):
            raise ValueError("dropout and enable_gqa are not supported")
        dtype = str(q.ty.dtype)
        if scale is None:
            head = q.ty.shape.values[-1]
            if not hasattr(head, "value"):
                raise ValueError("a symbolic head size")
            scale = 1.0 / math.sqrt(int(head.value))
        rank = len(k.ty.shape.values)
        kt = relax.op.permute_dims(k, [*range(rank - 2), rank - 1, rank - 2])
        scores = bb.emit(relax.op.multiply(relax.op.matmul(q, kt),
                                           relax.const(float(scale), dtype)))
        low = relax.const(float(np.finfo(dtype).min), dtype)
        if causal:
            sq, skv = scores.ty.shape.values[-2:]
            keep = relax.op.tril(relax.op.ones(relax.ShapeExpr([sq, skv]), dtype))
            scores = bb.emit(relax.op.where(relax.op.greater(keep, relax.const(0.0, dtype)),
                                            scores, low))
        if isinstance(mask, fx.Node):
            m = env[mask]
            scores = bb.emit(relax.op.where(m, scores, low) if str(m.ty.dtype) == "bool"
                             else relax.op.add(scores, m))
        probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
        return bb.emit(relax.op.matmul(probs, v))

    importer.convert_map[op] = convert


def _symbolic_upsample(importer) -> None:
    """Bilinear / nearest upsampling of a map with symbolic height and width (a UNet or
    DeepLabV3 exported with `8 * Dim` image sizes): TVM's converter computes the output size
    as `int(dim.value * scale)` and fails on a symbolic dim. The size is torch's output shape
    instead, with TVM's own choice of method and coordinate mode."""
    import torch

    ops = {"upsample_bilinear2d.vec": ("linear", 2, True),
           "upsample_nearest2d.vec": ("nearest_neighbor", 3, None)}
    for op, (method, align_at, align_default) in ops.items():
        fn = importer.convert_map.get(op)
        if fn is None:
            continue

        def convert(node, *rest, _fn=fn, _method=method, _at=align_at, _default=align_default):
            val = getattr(node, "meta", {}).get("val")
            if val is None or not any(isinstance(d, torch.SymInt) for d in val.shape[2:]):
                return _fn(node, *rest)
            size = [_relax_dim(d, _known_syms(importer)) for d in val.shape[2:]]
            if any(d is None for d in size):
                return _fn(node, *rest)
            align = node.args[_at] if len(node.args) > _at else \
                node.kwargs.get("align_corners", _default)
            return importer._upsample_impl(importer.env[node.args[0]], size=size,
                                           scale_factor=None, method=_method,
                                           align_corners=align)

        importer.convert_map[op] = convert


def _scans_through_topi(importer) -> None:
    """cumsum / cumprod as TOPI kernels (as the ONNX CumSum converter does): TVM's converter
    emits relax.cumsum, which nothing legalizes for llvm in this pipeline ("CodeGenVM cannot
    emit this Relax operator"; RoBERTa's position ids are a cumsum of the padding mask). The
    result has torch's dtype (a cumsum of int32 is int64)."""
    from tvm import topi

    for op, fn in (("cumsum.default", topi.cumsum), ("cumprod.default", topi.cumprod)):
        if op not in importer.convert_map:
            continue

        def convert(node, *rest, _fn=fn):
            x = importer.env[node.args[0]]
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            val = getattr(node, "meta", {}).get("val")
            dtype = _dtype(val.dtype) if val is not None else None
            return importer.block_builder.emit_te(_fn, x, dim, dtype)

        importer.convert_map[op] = convert


def _float_divisor(importer) -> None:
    """`torch.div(x, 2, rounding_mode="floor")` on a float tensor divides by 2.0 (torch
    promotes the int scalar); TVM's converter made an int32 constant of it and refused the
    mixed types (DETR's sine position embedding)."""
    fn = importer.convert_map.get("div.Tensor_mode")
    if fn is None:
        return

    def convert(node, *rest):
        if len(node.args) >= 2 and isinstance(node.args[1], int) \
                and not isinstance(node.args[1], bool):
            val = getattr(node.args[0], "meta", {}).get("val")
            if val is not None and getattr(val, "dtype", None) is not None \
                    and val.dtype.is_floating_point:
                node.args = (node.args[0], float(node.args[1]), *node.args[2:])
        return fn(node, *rest)

    importer.convert_map["div.Tensor_mode"] = convert


def _resolve_shapes(inputs: list[TensorInfo], overrides: dict[str, tuple[int, ...]],
                    bounds: dict[str, tuple[int, int | None]]) -> dict[str, int]:
    """The symbol values that --shape overrides imply, checked against the program.

    Raises:
        ShapeError: an override names no input, has the wrong rank, changes a static dim,
            gives one symbol two values, or a value outside the program's range.
    """
    names = [i.name for i in inputs]
    for name in overrides:
        if name not in names:
            raise ShapeError(f"--shape names '{name}', which is not a program input "
                             f"(inputs: {', '.join(names)})")
    values: dict[str, int] = {}
    for inp in inputs:
        if inp.name not in overrides:
            continue
        shape = overrides[inp.name]
        if len(shape) != len(inp.shape):
            raise ShapeError(f"--shape {inp.name}: rank {len(shape)} given, the program's input "
                             f"has rank {len(inp.shape)} ({inp.shape_str()})")
        for k, (given, declared) in enumerate(zip(shape, inp.shape)):
            if isinstance(declared, int):
                if declared != given:
                    raise ShapeError(f"--shape {inp.name}: dimension {k} is fixed to {declared} "
                                     f"by the program, {given} given")
                continue
            if not declared.isidentifier():
                raise ShapeError(f"--shape {inp.name}: dimension {k} is {declared}, derived from "
                                 "another dimension; set that one instead")
            if values.setdefault(declared, given) != given:
                raise ShapeError(f"--shape {inp.name}: dimension {k} is {declared}, already "
                                 f"given as {values[declared]}")
            lo, hi = bounds.get(declared, (None, None))
            if (lo is not None and given < lo) or (hi is not None and given > hi):
                raise ShapeError(f"--shape {inp.name}: dimension {k} ({declared}) must be in "
                                 f"[{lo}, {'inf' if hi is None else hi}] as exported, "
                                 f"{given} given")
    return values


def _bounds(ep) -> dict[str, tuple[int, int | None]]:
    import math

    out = {}
    for sym, vr in ep.range_constraints.items():
        try:
            hi = float(vr.upper)
            out[str(sym)] = (int(vr.lower), None if math.isinf(hi) else int(vr.upper))
        except (TypeError, ValueError, OverflowError):
            continue
    return out


def import_program(ep, shape_overrides: dict[str, tuple[int, ...]] | None = None):
    """Import an ExportedProgram into a Relax IRModule with weights bound as constants.

    Args:
        ep: a loaded `torch.export.ExportedProgram` (see load_program).
        shape_overrides: static shapes for inputs ('--shape'); the program's symbolic dims
            otherwise stay symbolic.

    Returns:
        An importer.ImportedModel (opset 0: a torch program has none).

    Raises:
        UnsupportedOpError: ATen ops TVM's importer cannot convert (all listed, with nodes).
        ShapeError: a --shape that does not fit the program.
        ImportFailure: a node failed to convert (named), or an input or output is no tensor.
    """
    from tvm import relax
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    from .importer import ImportedModel, _struct_to_info

    inputs = program_inputs(ep)
    values = _resolve_shapes(inputs, dict(shape_overrides or {}), _bounds(ep))
    outputs = program_outputs(ep)
    importer = ExportedProgramImporter()
    ep = _decompose(ep, importer.convert_map)
    missing = unsupported_ops(ep, importer.convert_map)
    if missing:
        raise UnsupportedOpError(_unsupported_message(missing))
    _cat_skips_empty(importer)
    _float_divisor(importer)
    _torch_shapes_for_slices(importer)
    _symbolic_repeat(importer)
    _attention_as_matmuls(importer)
    _symbolic_upsample(importer)
    _scans_through_topi(importer)
    _agreeing_broadcasts(importer)
    _naming_converters(importer)
    try:
        with _quiet():
            mod = importer.from_exported_program(ep, False, False, False, None)
    except (ImportFailure, ShapeError, UnsupportedOpError) as err:
        raise type(err)(str(err)) from None
    except Exception as err:
        raise ImportFailure(f"import failed: {error_line(err)[:300]}") from None
    main = mod["main"]
    ret = main.ret_ty
    fields = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    if len(fields) != len(outputs):
        raise ImportFailure(f"imported program returns {len(fields)} values, the program "
                            f"declares {len(outputs)} outputs")
    if values:
        syms = {v.name: v for p in mod["main"].params for v in _shape_vars(p)}
        mod = relax.transform.BindSymbolicVars({syms[k]: v for k, v in values.items()
                                                if k in syms}, "main")(mod)
        mod = _drop_bound_attrs(mod, set(values))
    mod = _plain_input_dims(mod)
    from .run_time_checks import check_index_ops

    try:
        mod = check_index_ops(mod, "torch program")
    except ValueError as err:
        raise ImportFailure(str(err)) from None
    main = mod["main"]
    input_dims = {v.name for p in main.params for v in _shape_vars(p)}
    in_infos = [_struct_to_info(p.name, p.ty, input_dims) for p in main.params]
    ret = main.ret_ty
    fields = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    out_infos = [_struct_to_info(o.name, s, input_dims) for o, s in zip(outputs, fields)]
    return ImportedModel(mod=mod, inputs=in_infos, outputs=out_infos, opset=0)


def _solvable(dim):
    """(var, scale, offset) when a derived input dim is scale * var + offset (how TVM's importer
    writes torch's `8 * Dim` or `Dim + 1`), else None."""
    from tvm import tirx

    if isinstance(dim, tirx.Mul):
        for k, v in ((dim.a, dim.b), (dim.b, dim.a)):
            if isinstance(k, tirx.IntImm) and isinstance(v, tirx.Var):
                return v, int(k.value), 0
    if isinstance(dim, tirx.Add):
        for v, c in ((dim.a, dim.b), (dim.b, dim.a)):
            if isinstance(c, tirx.IntImm) and isinstance(v, tirx.Var):
                return v, 1, int(c.value)
    return None


def _plain_input_dims(mod):
    """Inputs with derived dims (`8 * s69` for an image height exported as `8 * Dim`) take a
    plain dim instead: the VM cannot solve `H = 8 * s69` for s69 from an argument's shape.
    The function then defines s69 = (H - offset) // scale from a shape match_cast and casts the
    argument to its derived type, which checks at run time that H is such a multiple."""
    import tvm
    from tvm import relax, tirx

    main = mod["main"]
    new_params, prologue, defined = [], [], {}
    for p in main.params:
        shape = getattr(p.ty, "shape", None)
        values = list(getattr(shape, "values", None) or [])
        plain = []
        for d in values:
            solved = _solvable(d) if tvm.ir.is_prim_expr(d) else None
            if solved is None:
                plain.append(d)
                continue
            var, scale, offset = solved
            h = tirx.Var(f"{var.name}_{scale}" if offset == 0 else f"{var.name}___{offset}",
                         "int64")
            plain.append(h)
            if var.name not in defined:
                defined[var.name] = var
                prologue.append(relax.MatchCast(
                    relax.Var(f"_{var.name}", relax.ShapeType([var])),
                    relax.ShapeExpr([tirx.floordiv(h - offset, scale)]),
                    relax.ShapeType([var])))
        if len(plain) == len(values) and all(a.same_as(b) for a, b in zip(plain, values)):
            new_params.append(p)
            continue
        new = relax.Var(p.name, relax.TensorType(plain, p.ty.dtype))
        new_params.append(new)
        prologue.append(relax.MatchCast(p, new, p.ty))
    if not prologue:
        return mod
    # Shape definitions first, then the casts that use them.
    prologue.sort(key=lambda b: not isinstance(b.ty, relax.ShapeType))
    body = main.body
    seq = relax.SeqExpr([relax.BindingBlock(prologue), *body.blocks], body.body)
    func = relax.Function(new_params, seq, main.ret_ty, main.is_pure, main.attrs)
    mod = mod.clone()
    mod["main"] = func
    return mod


def _shape_vars(param) -> list:
    from tvm import tirx

    shape = getattr(param.ty, "shape", None)
    values = getattr(shape, "values", None) or []
    return [v for v in values if isinstance(v, tirx.Var)]


def _drop_bound_attrs(mod, names: set[str]):
    """Bounds of symbols now bound to numbers would name variables that no longer exist."""
    main = mod["main"]
    attrs = dict(main.attrs) if main.attrs is not None else {}
    changed = False
    for key in ("tir_var_lower_bound", "tir_var_upper_bound"):
        if key in attrs:
            kept = {k: v for k, v in dict(attrs[key]).items() if str(k) not in names}
            changed = True
            attrs[key] = kept
    if not changed:
        return mod
    main = main.without_attr("tir_var_lower_bound").without_attr("tir_var_upper_bound")
    for key in ("tir_var_lower_bound", "tir_var_upper_bound"):
        if attrs.get(key):
            main = main.with_attr(key, attrs[key])
    mod["main"] = main
    return mod


# ---------------------------------------------------------------------------- running in torch
def flat_callable(ep, module=None):
    """`ep.module()` (or `module`, e.g. its torch.compile'd form) called with the user inputs
    as one flat list, in the order of program_inputs: the program may have been exported with
    keyword arguments (a transformers model's input_ids=..., attention_mask=...)."""
    from torch.utils import _pytree as pytree

    module = module if module is not None else ep.module()
    spec = ep.call_spec.in_spec

    def call(*flat):
        args, kwargs = pytree.tree_unflatten(list(flat), spec) if spec is not None else (flat, {})
        return module(*args, **kwargs)

    return call


def run_program(ep, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The program run eagerly in torch on `feeds`: the reference for --verify.

    Raises:
        VerificationError: torch cannot run the program on these inputs.
    """
    import torch
    from torch.utils import _pytree as pytree

    from ..errors import VerificationError

    names = [n.name for n in _user_input_nodes(ep)]
    try:
        flat = [torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names]
        with torch.inference_mode(), _quiet():
            out = flat_callable(ep)(*flat)
    except Exception as err:
        shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in feeds.items())
        raise VerificationError(f"the reference, torch, cannot run the program on inputs "
                                f"{shapes}: {error_line(err)[:300]}") from None
    leaves = pytree.tree_leaves(out)
    return {name: t.detach().numpy() for name, t in zip(output_names(ep), leaves)}


# ---------------------------------------------------------------------------- inspect
def describe(path, ep=None):
    """`tvmopt inspect` for a .pt2: signature, ATen op histogram (core ATen, as imported),
    parameters, matmul/conv FLOPs and the ops TVM's importer cannot convert."""
    from .. import stage
    from .model_info import ModelInfo
    from ..files import sha256_file

    stage.enter("inspect", str(path))
    import torch

    ep = ep if ep is not None else load_program(path)
    inputs, outputs = program_inputs(ep), program_outputs(ep)
    tensors = list(ep.state_dict.values()) + [t for t in ep.constants.values()
                                              if isinstance(t, torch.Tensor)]
    params = sum(int(t.numel()) for t in tensors)
    pbytes = sum(int(t.numel()) * t.element_size() for t in tensors)
    flops, note = _flops(ep, inputs)
    core = _decompose(ep)
    hist = Counter(_op_name(n) for n in core.graph.nodes if n.op == "call_function")
    try:
        from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

        missing = unsupported_ops(core, ExportedProgramImporter().convert_map)
    except ImportError:
        missing = {}
    return ModelInfo(
        path=str(path), sha256=sha256_file(path), opset=0, ir_version=0,
        producer=f"torch {torch.__version__.split('+')[0]}", inputs=inputs, outputs=outputs,
        op_histogram=dict(hist.most_common()), node_count=sum(hist.values()),
        parameter_count=params, parameter_bytes=pbytes, flops=flops, flops_note=note,
        unsupported=missing, format=FORMAT)


def _flops(ep, inputs: list[TensorInfo]) -> tuple[int, str]:
    """torch's own FLOP counter (matmuls, convolutions, attention) over one run at symbolic
    dims = 1, on fake tensors: nothing is computed."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    symbolic = sorted({d for i in inputs for d in i.shape if isinstance(d, str)})
    note = "matmul/conv/attention FLOPs per inference (torch.utils.flop_counter)"
    if symbolic:
        note += f", with symbolic dims {', '.join(symbolic)} = 1"
    try:
        with _quiet(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
            args = [torch.empty([d if isinstance(d, int) else 1 for d in i.shape],
                                dtype=getattr(torch, i.dtype)) for i in inputs]
            counter = FlopCounterMode(display=False)
            with counter:
                flat_callable(ep)(*args)
        del mode
        return int(counter.get_total_flops()), note
    except Exception as err:  # noqa: BLE001 - fake tensors raise any type on an op they lack
        return 0, f"FLOPs not counted ({error_line(err)[:80]})"  # the reason is in the note
