"""Checks on a matched fp32 chain: what the pattern cannot say (layouts, shapes, bias and
mask broadcasts, intermediates used elsewhere) decides whether oneDNN takes it."""

from __future__ import annotations


import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from ...passes.values import const_array, f32_shape, scalar_value, static_f32_shape


def _leaks(ctx) -> bool:
    """True if an intermediate of the match is used outside it (it would be lost)."""
    defined = set(ctx.matched_bindings.keys())
    out_var = ctx.value_to_bound_var[ctx.matched_expr]
    for v in ctx.matched_bindings.keys():
        if v == out_var:
            continue
        if not isinstance(v, relax.DataflowVar):
            return True
        if any(u not in defined for u in ctx.var_usages.get(v, [])):
            return True
    return False


def _other_operand(add_call, chain_expr, ctx=None):
    """The operand of a binary op that is not the matched chain (given as expr or its var)."""
    chain = [chain_expr]
    if ctx is not None and chain_expr in ctx.value_to_bound_var:
        chain.append(ctx.value_to_bound_var[chain_expr])
    a, b = add_call.args
    if any(a.same_as(c) for c in chain):
        return b
    if any(b.same_as(c) for c in chain):
        return a
    return None


def _bias_ok(bias_expr, channels: int, ndim_out: int, channel_axis: int) -> bool:
    shape = static_f32_shape(bias_expr)
    if shape is None or int(np.prod(shape)) != channels or len(shape) > ndim_out:
        return False
    # Broadcasts along the channel axis only: (C,1,1), (1,C,1,1) for conv; (N,), (1,N) for matmul.
    full = [1] * (ndim_out - len(shape)) + shape
    return all(d == 1 for i, d in enumerate(full) if i != channel_axis)


def _clip_bounds(call, ctx) -> tuple[float, float] | None:
    """(lo, hi) of R.clip(x, lo, hi) or R.minimum(R.maximum(x, lo), hi) with scalar bounds."""
    if call.op.name == "relax.clip":
        lo, hi = scalar_value(call.args[1]), scalar_value(call.args[2])
    else:
        inner = call.args[0]
        inner = ctx.matched_bindings.get(inner, inner)
        if not isinstance(inner, relax.Call) or inner.op.name != "relax.maximum":
            return None
        lo, hi = scalar_value(inner.args[1]), scalar_value(call.args[1])
    if lo is None or hi is None:
        return None
    return lo, hi


# The activation/weight layouts the extension's convolutions take.
_CONV_LAYOUTS = (("NCHW", "OIHW", "NCHW"), ("NHWC", "OHWI", "NHWC"), ("NHWC", "HWIO", "NHWC"))


def _conv_layouts_ok(attrs) -> bool:
    return (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) in _CONV_LAYOUTS


def _conv_act_shape(e) -> list | None:
    """A convolution activation's 4 dims: static, but for the batch, which may be symbolic
    (a model exported with a dynamic batch): the extension makes one primitive per batch size
    it meets, as it does per row count for a dense layer."""
    dims = f32_shape(e)
    if dims is None or len(dims) != 4 or not all(isinstance(d, int) for d in dims[1:]):
        return None
    return dims


def _same_shape(x, y) -> bool:
    return x is not None and y is not None and len(x) == len(y) and all(map(_same_dim, x, y))


def _check_conv(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    conv = ann["conv"]
    a = conv.attrs
    if not _conv_layouts_ok(a):
        return False
    if a.out_dtype not in (None, "", "float32"):
        return False
    c_axis = 1 if a.data_layout == "NCHW" else 3
    data_s, out_s = _conv_act_shape(conv.args[0]), _conv_act_shape(conv)
    w_s = static_f32_shape(conv.args[1])
    if data_s is None or w_s is None or out_s is None:
        return False
    if "bias" in ann:
        if not _bias_ok(_other_operand(ann["bias"], conv, ctx), out_s[c_axis], 4, c_axis):
            return False
    if "act" in ann and ann["act"].op.name in ("relax.clip", "relax.minimum"):
        if _clip_bounds(ann["act"], ctx) is None:
            return False
    if "res" in ann:
        res = ann["res"]
        prev = ann.get("act", ann.get("bias", conv))
        other = _other_operand(res, prev, ctx)
        # The residual must already have the output's shape: the sum post-op does not broadcast.
        if other is None or not _same_shape(f32_shape(other), out_s) or \
                not _same_shape(f32_shape(res), out_s):
            return False
        # conv -> relu -> add(relu, conv) would make the residual a value computed inside the
        # fused region, which the packed call cannot receive as an input.
        if any(other.same_as(v) for v in ctx.matched_bindings.keys()):
            return False
    return True


def _check_matmul(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    mm = ann["matmul"]
    b_s = static_f32_shape(mm.args[1])
    if b_s is None:
        return False
    if len(b_s) == 2:
        # A dense layer: a's leading dims fold into the rows, so they may be symbolic (dynamic
        # batch / sequence); the library makes one primitive per row count it meets.
        a_s, o_s = f32_shape(mm.args[0]), f32_shape(mm)
        if a_s is None or o_s is None or not isinstance(a_s[-1], int) or \
                not isinstance(o_s[-1], int):
            return False
    else:
        a_s, o_s = static_f32_shape(mm.args[0]), static_f32_shape(mm)
        if a_s is None or o_s is None:
            return False
    if mm.attrs.out_dtype not in (None, "", "float32"):
        return False
    if len(a_s) < 2 or len(b_s) < 2 or len(o_s) > 4 or len(a_s) > 4:
        return False
    if len(b_s) > 2:
        # Batched constant b: same rank as a, each batch dim equal or broadcast from 1.
        if len(b_s) != len(a_s) or any(bd not in (1, ad) for ad, bd in zip(a_s[:-2], b_s[:-2])):
            return False
    if "bias" in ann:
        if not _bias_ok(_other_operand(ann["bias"], mm, ctx), o_s[-1], len(o_s), len(o_s) - 1):
            return False
    if "res" in ann:
        other = _other_operand(ann["res"], ann.get("bias", mm), ctx)
        # A tensor of the output's own shape (the sum post-op does not broadcast), from
        # outside the match, and not a constant (a second bias).
        r_s = f32_shape(other) if other is not None else None
        if (r_s is None or len(r_s) != len(o_s) or not all(map(_same_dim, r_s, o_s))
                or const_array(other) is not None
                or any(other.same_as(v) for v in ctx.matched_bindings.keys())):
            return False
    return True


def _same_dim(x, y) -> bool:
    if isinstance(x, int) or isinstance(y, int):
        return isinstance(x, int) and isinstance(y, int) and x == y
    return tvm_ffi.structural.structural_equal(x, y, map_free_vars=False)


def _check_bmm(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    mm = ann["matmul"]
    b = mm.args[1]
    if "transpose" in ann:
        t = ann["transpose"]
        b = t.args[0]
        nd = len(f32_shape(b) or [])
        axes = None if t.attrs.axes is None else [int(a) for a in t.attrs.axes]
        if nd < 2 or (axes or list(range(nd))[::-1]) != [*range(nd - 2), nd - 1, nd - 2]:
            return False
    a_s, b_s, o_s = f32_shape(mm.args[0]), f32_shape(b), f32_shape(mm)
    if a_s is None or b_s is None or o_s is None or const_array(b) is not None:
        return False
    if mm.attrs.out_dtype not in (None, "", "float32"):
        return False
    if not 2 <= len(a_s) <= 4 or len(b_s) != len(a_s) or len(o_s) != len(a_s):
        return False
    # Batch dims equal, or 1 on one side (what the library broadcasts).
    for x, y in zip(a_s[:-2], b_s[:-2]):
        if not (_same_dim(x, y) or x == 1 or y == 1):
            return False
    if "scale" in ann:
        arr = const_array(ann["scale"].args[1])
        if arr is None or arr.size != 1 or not np.isfinite(arr).all() or float(arr.reshape(-1)[0]) == 0:
            return False
    return True


def _attention_mask_ok(ann, scores, ctx) -> bool:
    """The mask of an attention match: a boolean (where) or fp32 (add) tensor that broadcasts
    to the scores without changing their shape, and a where's fill a finite or -inf scalar."""
    m = ann["mask"]
    name = m.op.name
    if name == "relax.where":
        cond = m.args[0]
        fill = m.args[1] if const_array(m.args[1]) is not None else m.args[2]
        arr = const_array(fill)
        if arr is None or arr.size != 1 or np.isnan(arr).any():
            return False
        mask = cond
        ty = mask.ty
        if not isinstance(ty, relax.TensorType) or str(ty.dtype) not in ("bool", "uint8", "int8"):
            return False
        dims = None if ty.shape is None else [
            int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in ty.shape.values]
    else:
        mask = _other_operand(m, ann["scale"] if "scale" in ann else ann["matmul"], ctx)
        dims = f32_shape(mask)
    if dims is None or len(dims) > len(scores):
        return False
    return all(d == 1 or _same_dim(d, s) for d, s in zip(dims[::-1], scores[::-1]))


def _check_attention(ctx) -> bool:
    """fp32 q, k, v of one rank (static or symbolic dims) with the same batch dims, the
    softmax over the scores' last axis, and a mask (if any) that broadcasts to the scores."""
    if not _check_bmm(ctx):
        return False
    ann = ctx.annotated_expr
    sm, out = ann["softmax"], ann["weighted"]
    q, v = ann["matmul"].args[0], out.args[1]
    k = ann["transpose"].args[0] if "transpose" in ann else ann["matmul"].args[1]
    shapes = [f32_shape(e) for e in (q, k, v, ann["matmul"], out)]
    if any(s is None for s in shapes) or const_array(v) is not None:
        return False
    q_s, k_s, v_s, s_s, o_s = shapes
    if not len(q_s) == len(k_s) == len(v_s) == len(o_s):
        return False
    if not all(_same_dim(a, b) and _same_dim(a, c)
               for a, b, c in zip(q_s[:-2], k_s[:-2], v_s[:-2])):
        return False
    if out.attrs.out_dtype not in (None, "", "float32"):
        return False
    if "mask" in ann:
        masked = f32_shape(ann["mask"])
        if masked is None or len(masked) != len(s_s) or not all(
                _same_dim(a, b) for a, b in zip(masked, s_s)):
            return False  # the mask would broadcast the scores to a larger shape
        if not _attention_mask_ok(ann, s_s, ctx):
            return False
    return int(sm.attrs.axis) in (-1, len(s_s) - 1) and _same_dim(v_s[-2], s_s[-1])
