"""Patterns and their checks for the int8 chains: QDQ convolutions and matmuls
(`quantize_static`), and a dynamically quantized model's ConvInteger / MatMulInteger."""

from __future__ import annotations


import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ...passes.values import const_array, static_f32_shape
from .checks import _bias_ok, _clip_bounds, _conv_layouts_ok, _leaks, _other_operand
from .common import _is
from .extension import _PREFIX
from .int8 import _int32_conv
from .patterns import _act_patterns


def _qdq_input(permute: bool):
    """quantize -> dequantize of an activation [-> transpose into the convolution's layout]."""
    q = is_op("relax.quantize")(wildcard(), is_const(), is_const())
    d = is_op("relax.dequantize")(q, is_const(), is_const())
    return (is_op("relax.permute_dims")(d) if permute else d), q, d


def _int8_weight():
    return is_op("relax.dequantize")(is_const(), is_const(), is_const())


def _int8_input(permute: bool):
    """dequantize of an 8-bit activation [-> transpose into the convolution's layout]: the
    output of another int8 call, or of a quantize left outside (`lower` may take it in)."""
    d = is_op("relax.dequantize")(wildcard(), is_const(), is_const())
    return (is_op("relax.permute_dims")(d) if permute else d), None, d


def _qconv_patterns():
    """conv2d of a QDQ input and an int8 weight [+bias] [+relu|clip] [QDQ of the output
    + residual [+relu]], largest first. The residual join of a QDQ ResNet block is
    dequantize(quantize(conv)) + residual: post-ops of the int8 call instead of TVM kernels.

    Every chain starts at the dequantize of its 8-bit input (`_u8`), whoever wrote it: so
    the quantize before it stays free for the chain that produces its input, whose output is
    then quantized in its int8 call (`_q`), and consecutive int8 convolutions pass u8/s8
    tensors, with no quantize / dequantize kernel between them. A quantize no call took, read
    by one call only, goes into that call when it is lowered (fp32 in)."""
    pats = []
    for res in (2, 1):  # 2: residual then relu, 1: residual
        pats += [p for p in _qconv_chain_patterns(res, src_int8=True)]
    pats += [p for p in _qconv_chain_patterns(0, src_int8=True, quantize_out=True)]
    pats += [p for p in _qconv_chain_patterns(0, src_int8=True)]
    return pats


def _qconv_chain_patterns(res: int, src_int8: bool = False, quantize_out: bool = False):
    pats = []
    for act in ("relu", "clip", None):
        for bias in (True, False):
            for permute in (True, False):
                x, q, d = (_int8_input if src_int8 else _qdq_input)(permute)
                w = _int8_weight()
                conv = is_op("relax.nn.conv2d")(x, w)
                ann = {"conv": conv, "dequantize": d, "weight": w, "input": x}
                if q is not None:
                    ann["quantize"] = q
                out, name = conv, "qconv2d_u8" if src_int8 else "qconv2d"
                if bias:
                    out = is_op("relax.add")(out, is_const())
                    ann["bias"], name = out, name + "_bias"
                if act:
                    out = _act_patterns(out)[act]
                    ann["act"], name = out, name + "_" + act
                if res:
                    oq = is_op("relax.quantize")(out, is_const(), is_const())
                    od = is_op("relax.dequantize")(oq, is_const(), is_const())
                    r = wildcard()
                    out = is_op("relax.add")(od, r) | is_op("relax.add")(r, od)
                    ann.update(out_quantize=oq, out_dequantize=od, res=out)
                    name += "_res"
                    if res == 2:
                        out = is_op("relax.nn.relu")(out)
                        ann["post"], name = out, name + "_relu"
                if quantize_out:
                    out = is_op("relax.quantize")(out, is_const(), is_const())
                    ann["quantize_out"], name = out, name + "_q"
                pats.append((_PREFIX + name, out, ann))
    return pats


def _qmatmul_patterns():
    pats = []
    for act in ("relu", "gelu", "gelu_tanh", None):
        for bias in (True, False):
            x, q, d = _qdq_input(False)
            w = _int8_weight()
            mm = is_op("relax.matmul")(x, w)
            ann = {"matmul": mm, "quantize": q, "dequantize": d, "weight": w}
            out, name = mm, "qmatmul"
            if bias:
                out = is_op("relax.add")(out, is_const())
                ann["bias"], name = out, name + "_bias"
            if act:
                out = is_op({"relu": "relax.nn.relu", "gelu": "relax.nn.gelu",
                             "gelu_tanh": "relax.nn.gelu_tanh"}[act])(out)
                ann["act"], name = out, name + "_" + act
            pats.append((_PREFIX + name, out, ann))
    return pats


def _dynamic_input():
    """ONNX DynamicQuantizeLinear + MatMulInteger's input side as imported: the activation
    quantized to u8 with run-time (scale, zero point), widened to int32, minus the zero point."""
    x, scale, zp = wildcard(), wildcard(), wildcard()
    q = is_op("relax.quantize")(x, scale, zp)
    d = is_op("relax.subtract")(is_op("relax.astype")(q), is_op("relax.astype")(zp))
    return d, q, scale


def _dqmatmul_patterns():
    """MatMulInteger of a dynamically quantized activation and a constant int8 weight (widened
    to int32, minus its zero point), cast to fp32, times x_scale * w_scale [+bias] [+act]."""
    pats = []
    for act in ("relu", "gelu", "gelu_tanh", None):
        for bias in (True, False):
            for wzp in (True, False):
                d, q, scale = _dynamic_input()
                w = is_const()
                wzpc = is_const()
                wq = is_op("relax.subtract")(w, is_op("relax.astype")(wzpc)) if wzp else w
                mm = is_op("relax.matmul")(d, wq)
                f = is_op("relax.astype")(mm)
                sc = is_op("relax.multiply")(scale, is_const())
                out = is_op("relax.multiply")(f, sc) | is_op("relax.multiply")(sc, f)
                ann = {"matmul": mm, "quantize": q, "weight": w,
                       "scales": sc, "scaled": out}
                if wzp:
                    ann["weight_zp"] = wzpc
                name = "qmatmul_dynamic"
                if bias:
                    out = is_op("relax.add")(out, is_const()) | is_op("relax.add")(is_const(), out)
                    ann["bias"], name = out, name + "_bias"
                if act:
                    out = is_op({"relu": "relax.nn.relu", "gelu": "relax.nn.gelu",
                                 "gelu_tanh": "relax.nn.gelu_tanh"}[act])(out)
                    ann["act"], name = out, name + "_" + act
                pats.append((_PREFIX + name, out, ann))
    return pats


def _dqconv_patterns():
    """ConvInteger of a dynamically quantized activation and a constant int8-valued weight, as
    imported and moved to NHWC: [transpose to NCHW ->] quantize with the run-time (scale, zero
    point) -> widen -> minus the zero point -> [transpose to NHWC ->] int32 conv2d, cast to
    fp32, times x_scale * w_scale [+bias] [+relu|clip] [+residual [+relu]]. The transposes
    around the quantize are ConvertLayout's (relax.quantize has no layout rule): taken into the
    call, they cancel."""
    pats = []
    for res in (2, 1, 0):  # 2: residual then relu, 1: residual, 0: none
        for act in ("relu", "clip", None):
            for bias in (True, False):
                x = is_op("relax.permute_dims")(wildcard()) | wildcard()
                scale, zp = wildcard(), wildcard()
                q = is_op("relax.quantize")(x, scale, zp)
                d = is_op("relax.subtract")(is_op("relax.astype")(q), is_op("relax.astype")(zp))
                d = is_op("relax.permute_dims")(d) | d
                w = is_const() | is_op("relax.subtract")(is_const(),
                                                         is_op("relax.astype")(is_const()))
                w = is_op("relax.permute_dims")(w) | w
                conv = is_op("relax.nn.conv2d")(d, w)
                f = is_op("relax.astype")(conv)
                sc = is_op("relax.multiply")(scale, is_const())
                out = is_op("relax.multiply")(f, sc) | is_op("relax.multiply")(sc, f)
                ann = {"conv": conv, "quantize": q, "input": d, "weight": w, "scales": sc,
                       "scaled": out}
                name = "qconv2d_dynamic"
                if bias:
                    out = is_op("relax.add")(out, is_const()) | is_op("relax.add")(is_const(), out)
                    ann["bias"], name = out, name + "_bias"
                if act:
                    out = _act_patterns(out)[act]
                    ann["act"], name = out, name + "_" + act
                if res:
                    r = wildcard()
                    out = is_op("relax.add")(out, r) | is_op("relax.add")(r, out)
                    ann["res"], name = out, name + "_res"
                    if res == 2:
                        out = is_op("relax.nn.relu")(out)
                        ann["post"], name = out, name + "_relu"
                pats.append((_PREFIX + name, out, ann))
    return pats


def _qdq_pair_ok(ann) -> bool:
    """A per-tensor quantize to u8/s8 and the dequantize undoing it (same scale, zero point)."""
    q, d = ann["quantize"], ann["dequantize"]
    if str(q.attrs.out_dtype) not in ("uint8", "int8") or static_f32_shape(q.args[0]) is None:
        return False
    qs, qz, ds, dz = (const_array(e) for e in (*q.args[1:3], *d.args[1:3]))
    if any(a is None or a.size != 1 for a in (qs, qz, ds, dz)):
        return False
    return float(qs.reshape(())) == float(ds.reshape(())) and int(qz.reshape(())) == int(
        dz.reshape(())) and float(qs.reshape(())) > 0


def _int8_weight_ok(w, out_axis: int, ndim: int) -> bool:
    """Int8 weight with zero point 0 and one scale, or one per output channel (`out_axis`)."""
    q, scale, zp = (const_array(e) for e in w.args[:3])
    if q is None or q.dtype != np.int8 or q.ndim != ndim or scale is None or zp is None:
        return False
    if zp.any() or scale.dtype != np.float32:
        return False
    return scale.size == 1 or (int(w.attrs.axis) % ndim == out_axis
                               and scale.size == q.shape[out_axis])


def _per_tensor_int8(q, dtype_of) -> bool:
    """A quantize / dequantize to or from u8/s8 with one constant scale (> 0) and zero point."""
    s, z = const_array(q.args[1]), const_array(q.args[2])
    return (dtype_of in ("uint8", "int8") and s is not None and z is not None and s.size == 1
            and z.size == 1 and float(s.reshape(())) > 0)


def _check_qconv(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    conv = ann["conv"]
    a = conv.attrs
    if not _conv_layouts_ok(a) or a.out_dtype not in (None, "", "float32"):
        return False
    if "quantize" in ann:
        if not _qdq_pair_ok(ann) or len(static_f32_shape(ann["quantize"].args[0]) or []) != 4:
            return False
    else:  # the 8-bit tensor another call (or a quantize outside) wrote
        d = ann["dequantize"]
        src = d.args[0]
        if not _per_tensor_int8(d, str(getattr(src.ty, "dtype", ""))) or \
                len(_static_shape(src) or []) != 4:
            return False
    if "quantize_out" in ann:
        oq = ann["quantize_out"]
        if not _per_tensor_int8(oq, str(oq.attrs.out_dtype)) or _static_shape(oq) is None:
            return False
    x = ann["input"]
    if _is(x, "relax.permute_dims") and (
            a.data_layout != "NHWC" or [int(i) for i in x.attrs.axes] != [0, 2, 3, 1]):
        return False
    if not _int8_weight_ok(ann["weight"], a.kernel_layout.index("O"), 4):
        return False
    out_s = static_f32_shape(conv)
    if out_s is None:
        return False
    c_axis = a.data_layout.index("C")
    if "bias" in ann:
        if not _bias_ok(_other_operand(ann["bias"], conv, ctx), out_s[c_axis], 4, c_axis):
            return False
    if "act" in ann and ann["act"].op.name in ("relax.clip", "relax.minimum"):
        if _clip_bounds(ann["act"], ctx) is None:
            return False
    if "res" in ann:
        oq, odq = ann["out_quantize"], ann["out_dequantize"]
        if not _qdq_pair_ok({"quantize": oq, "dequantize": odq}):
            return False
        other = _other_operand(ann["res"], odq, ctx)
        # A residual made inside the match, or one that broadcasts, is not a sum post-op.
        if other is None or static_f32_shape(other) != out_s or \
                any(other.same_as(v) for v in ctx.matched_bindings.keys()):
            return False
    return True


def _check_qmatmul(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    mm = ann["matmul"]
    a_s, o_s = static_f32_shape(mm.args[0]), static_f32_shape(mm)
    if a_s is None or o_s is None or not 2 <= len(a_s) <= 4:
        return False
    if mm.attrs.out_dtype not in (None, "", "float32") or not _qdq_pair_ok(ann):
        return False
    if not _int8_weight_ok(ann["weight"], 1, 2):
        return False
    if "bias" in ann:
        if not _bias_ok(_other_operand(ann["bias"], mm, ctx), o_s[-1], len(o_s), len(o_s) - 1):
            return False
    return True


def _int8_valued(arr) -> bool:
    """An integer constant whose values an s8 tensor holds (the importer widens int8 weights)."""
    return (arr is not None and arr.dtype.kind in "iu" and arr.size > 0
            and arr.min() >= -128 and arr.max() <= 127)


def _check_dqmatmul(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    mm, q = ann["matmul"], ann["quantize"]
    # Static shapes, as the other patterns: the dispatch timing runs each kernel alone.
    x_s = static_f32_shape(q.args[0])
    w = const_array(ann["weight"])
    if x_s is None or not 2 <= len(x_s) <= 4 or str(q.attrs.out_dtype) != "uint8":
        return False
    if not _int8_valued(w) or w.ndim != 2 or w.shape[0] != x_s[-1]:
        return False
    if "weight_zp" in ann:
        wzp = const_array(ann["weight_zp"])
        if wzp is None or wzp.any():
            return False  # a weight zero point other than 0 is not an s8 oneDNN weight
    n = w.shape[1]
    wscale = const_array(_other_operand(ann["scales"], q.args[1], ctx))
    if wscale is None or wscale.dtype != np.float32 or wscale.size not in (1, n):
        return False
    if "bias" in ann:
        bias = const_array(_other_operand(ann["bias"], ann["scaled"], ctx))
        if bias is None or bias.dtype != np.float32 or bias.size != n:
            return False
    return str(mm.attrs.out_dtype) == "int32"


def _static_shape(e) -> list[int] | None:
    """A tensor's static dims, whatever its type; None if any is symbolic or unknown."""
    shape = getattr(e.ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr) or not all(
            isinstance(d, tvm.tirx.IntImm) for d in shape.values):
        return None
    return [int(d) for d in shape.values]


def _int_weight(e, look):
    """The integer weight a dynamic conv pattern matched (a constant [minus its zero point]
    [transposed]), as an array in the convolution's kernel layout; None unless the zero point
    is 0 (an s8 oneDNN weight has none). `look` maps a var to its bound value."""
    e = look(e)
    arr = const_array(e)
    if arr is not None:
        return arr
    if _is(e, "relax.permute_dims"):
        inner = _int_weight(e.args[0], look)
        if inner is None:
            return None
        axes = e.attrs.axes
        return inner.transpose([int(i) for i in axes] if axes is not None else None)
    if _is(e, "relax.subtract"):
        w, wide = const_array(look(e.args[0])), look(e.args[1])
        zp = const_array(look(wide.args[0])) if _is(wide, "relax.astype") else None
        return w if w is not None and zp is not None and not zp.any() else None
    return None


def _check_dqconv(ctx) -> bool:
    if _leaks(ctx):
        return False
    ann = ctx.annotated_expr
    conv, q = ann["conv"], ann["quantize"]
    a = conv.attrs
    look = lambda e: ctx.matched_bindings.get(e, e)  # noqa: E731
    if not _conv_layouts_ok(a) or str(q.attrs.out_dtype) != "uint8":
        return False
    if not _int32_conv(conv) or static_f32_shape(q.args[0]) is None:
        return False
    # The data's layout as the call sees it: the transposes around the quantize cancel, or
    # only the one into the NHWC convolution is there (the data is then NCHW).
    lead, inp = look(q.args[0]), ann["input"]
    to_nchw = _is(lead, "relax.permute_dims")
    to_nhwc = _is(inp, "relax.permute_dims")
    if to_nchw and [int(i) for i in lead.attrs.axes] != [0, 3, 1, 2]:
        return False
    if to_nchw and not to_nhwc:
        return False
    if to_nhwc and (a.data_layout != "NHWC" or [int(i) for i in inp.attrs.axes] != [0, 2, 3, 1]):
        return False
    w = _int_weight(ann["weight"], look)
    w_shape, out_shape = _static_shape(conv.args[1]), _static_shape(conv)
    if not _int8_valued(w) or w_shape is None or list(w.shape) != w_shape or out_shape is None:
        return False
    c_axis = a.data_layout.index("C")
    n = out_shape[c_axis]
    wscale = const_array(_other_operand(ann["scales"], q.args[1], ctx))
    if wscale is None or wscale.dtype != np.float32 or wscale.size not in (1, n):
        return False
    chain = ann["scaled"]
    if "bias" in ann:
        bias = _other_operand(ann["bias"], chain, ctx)
        if const_array(bias) is None or not _bias_ok(bias, n, 4, c_axis):
            return False
        chain = ann["bias"]
    if "act" in ann:
        if ann["act"].op.name in ("relax.clip", "relax.minimum") and \
                _clip_bounds(ann["act"], ctx) is None:
            return False
        chain = ann["act"]
    if "res" in ann:
        other = _other_operand(ann["res"], chain, ctx)
        # A residual made inside the match, or one that broadcasts, is not a sum post-op; a
        # constant one would read as the bias.
        if other is None or static_f32_shape(other) != out_shape or \
                const_array(other) is not None or \
                any(other.same_as(v) for v in ctx.matched_bindings.keys()):
            return False
    return True
