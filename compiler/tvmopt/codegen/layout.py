"""Relax-level rewrites before legalization that the CPU kernels rely on.

* `lift_clip`: the ONNX importer emits Clip (ReLU6) as call_tir of topi.maximum/minimum,
  which neither op patterns (library dispatch) nor ConvertLayout can see through: every ReLU6
  would end a fused conv and get a pair of transposes around it.
* `channels_last`: conv2d in NHWC activations, so a convolution's vector axis is the output
  channel (a multiple of the vector width in practice) instead of the image width (7, 14, 28 in
  late ResNet stages). Weight re-layouts fold into the constants; transposes remain only where
  the graph's own layout starts and ends, so the artifact's interface does not change.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi.structural
from tvm import relax, topi

from .. import fallbacks
from ..passes.values import const_array, f32_shape


def _te_prim_func(name: str, x_ty, c):
    bb = relax.BlockBuilder()
    x = relax.Var("x", x_ty)
    with bb.function("f", [x]):
        bb.emit_func_output(bb.emit_te(getattr(topi, name), x, c))
    return next(f for f in bb.get().functions.values() if isinstance(f, tvm.tirx.PrimFunc))


@relax.expr_functor.mutator
class _LiftClip(relax.PyExprMutator):
    """Turn the importer's TE max/min (ONNX Clip, i.e. ReLU6) back into relax.maximum/minimum.

    The ONNX frontend emits Clip as call_tir of topi.maximum/minimum, which no pattern over
    Relax ops can see. A call_tir is lifted only if its PrimFunc is structurally identical to
    what topi produces for the same operands, so other call_tirs are never misread.
    """

    def __init__(self, mod):
        super().__init__(mod)
        self.mod_ = mod

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir"):
            return call
        gv, args = call.args[0], call.args[1]
        if (len(call.args) != 2 or not isinstance(args, relax.Tuple) or len(args.fields) != 2):
            return call
        x, c = args.fields
        carr = const_array(c)
        if carr is None or carr.size != 1 or carr.dtype != np.float32:
            return call
        if f32_shape(x) is None:  # static or symbolic: the reference is built on x's own type
            return call
        func = self.mod_[gv]
        for name, op in (("maximum", relax.op.maximum), ("minimum", relax.op.minimum)):
            ref = _te_prim_func(name, x.ty, c)
            if tvm_ffi.structural.structural_equal(ref, func, map_free_vars=True):
                return op(x, c)
        return call


def lift_clip(mod: tvm.IRModule) -> tvm.IRModule:
    """Every importer-made TE maximum/minimum by a scalar constant back as relax ops."""
    lift = _LiftClip(mod)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = lift.visit_expr(func)
    return relax.transform.DeadCodeElimination()(mod)


@tvm.transform.module_pass(opt_level=0, name="tvmopt.LiftClip")
def LiftClip(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    return lift_clip(mod)


@relax.expr_functor.mutator
class _Conv1dAsConv2d(relax.PyExprMutator):
    """conv1d (NCW / OIW) as a conv2d of height 1 between an expand_dims and a squeeze (views,
    no copies), so 1-D convolutions (audio stems, wav2vec2's feature encoder) take the 2-D
    path: NHWC default schedules and the oneDNN convolution."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv1d"):
            return call
        a = call.attrs
        if (a.data_layout, a.kernel_layout, a.out_layout) != ("NCW", "OIW", "NCW"):
            return call
        x, w = call.args
        y = relax.op.nn.conv2d(
            relax.op.expand_dims(x, [2]), relax.op.expand_dims(w, [2]),
            strides=[1, int(a.strides[0])], padding=[0, int(a.padding[0]), 0, int(a.padding[1])],
            dilation=[1, int(a.dilation[0])], groups=int(a.groups),
            out_dtype=a.out_dtype if str(a.out_dtype) else None)
        return relax.op.squeeze(y, [2])


def channels_last(kernel_layout: str = "HWIO") -> list:
    """Passes (before LegalizeOps) moving conv2d to NHWC with `kernel_layout` weights.

    Only modules with a conv2d (or a conv1d, made one first) change. ConvertLayout refuses some graphs (a match_cast of a
    data-dependent shape: "exactly one of the layouts is unknown") or makes an ill-formed
    module of them (a free var after a match_cast); those keep their layout, recorded as a
    fallback (tvmopt.fallbacks).
    """
    # conv2d_transpose / conv1d_transpose are pinned to NCHW / NCW: they would otherwise follow
    # their NHWC producer (a conv1d is a conv2d of height 1 here), and TVM's legalizer lowers
    # only NCHW/IOHW and NCW/IOW, leaving an op the VM codegen cannot emit.
    desired = {"relax.nn.conv2d": ["NHWC", kernel_layout],
               "relax.nn.conv2d_transpose": ["NCHW", "IOHW"],
               "relax.nn.conv1d_transpose": ["NCW", "IOW"]}
    convert = tvm.ir.transform.Sequential([
        LiftClip, SpellQDQ, Conv1dAsConv2d, relax.transform.ConvertLayout(desired),
        relax.transform.Normalize(), relax.transform.FoldConstant(), FoldQDQ])

    @tvm.transform.module_pass(opt_level=0, name="tvmopt.ChannelsLast")
    def channels_last_pass(mod, _ctx):
        if not _has_conv2d(mod):
            return mod
        try:
            out = convert(mod)
        except Exception as err:  # noqa: BLE001 - TVM's passes raise any type
            fallbacks.record("layout_rewrite", "tvmopt.ChannelsLast", err)
            return mod
        # ConvertLayout re-emits a match_cast whose layout does not change as it was, still
        # reading the var its operand had before that operand was re-emitted: the result reads
        # a var nothing defines, which code generation refuses ("Var lv34 is not defined").
        # wav2vec2's residual add, whose operands are asserted to one spelling of the frame
        # count (torch_program._agreeing_broadcasts), is one such graph; it keeps its layout.
        if _well_formed(out):
            return out
        fallbacks.record("layout_rewrite", "tvmopt.ChannelsLast",
                         "relax.transform.ConvertLayout made an ill-formed module")
        return mod

    return [channels_last_pass]


def _well_formed(mod) -> bool:
    """Every var defined before it is read (types are not checked)."""
    return bool(relax.analysis.check_well_formed(mod, check_ty=False))


def _has_conv2d(mod) -> bool:
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and \
                e.op.name in ("relax.nn.conv2d", "relax.nn.conv1d"):
            found.append(e)

    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return bool(found)


# --------------------------------------------------------------------------------------------
# Per-tensor quantize/dequantize through ConvertLayout
# --------------------------------------------------------------------------------------------
#
# relax.quantize / relax.dequantize have no FRelaxInferLayout rule, and TVM 0.27 offers no way
# to write one from Python (InferLayoutOutput and LayoutDecision have no Python constructors),
# so ConvertLayout puts every QDQ pair of a quantized CNN back in NCHW: two transposes per layer
# around the int8 kernels. A per-tensor pair (scalar scale and zero point) is elementwise, so
# before ConvertLayout it is spelled with ops that have layout rules, and after it the same
# spelling is folded back into quantize/dequantize, now in the converted layout. Per-channel
# pairs (weights) are left alone: their axis would need remapping, and they are constants
# folded before this phase anyway.


def _scalar_param(e, dtypes) -> np.ndarray | None:
    arr = const_array(e)
    if arr is None or arr.size != 1 or arr.dtype.name not in dtypes:
        return None
    return arr.reshape(())


def _dtype(e) -> str | None:
    ty = e.ty
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


_QTYPES = ("int8", "uint8")


@relax.expr_functor.mutator
class _SpellQDQ(relax.PyExprMutator):
    """Per-tensor quantize -> astype(min(max(round(x / s) + zp, lo), hi)) and dequantize ->
    (astype(q, f32) - zp) * s: relax's own legalization of both, op for op."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name not in ("relax.quantize",
                                                                       "relax.dequantize"):
            return call
        x, s, zp = call.args[:3]
        s, zp = _scalar_param(s, ("float32",)), _scalar_param(zp, _QTYPES + ("int32",))
        if s is None or zp is None:
            return call
        f32 = lambda v: relax.const(np.float32(v), "float32")  # noqa: E731
        out = str(call.attrs.out_dtype)
        if call.op.name == "relax.quantize":
            if _dtype(x) != "float32" or out not in _QTYPES:
                return call
            info = np.iinfo(out)
            y = relax.op.add(relax.op.round(relax.op.divide(x, f32(s))), f32(zp))
            y = relax.op.minimum(relax.op.maximum(y, f32(info.min)), f32(info.max))
            return relax.op.astype(y, out)
        if _dtype(x) not in _QTYPES or out != "float32":
            return call
        return relax.op.multiply(relax.op.subtract(relax.op.astype(x, "float32"), f32(zp)),
                                 f32(s))


def _call(e, name):
    return isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == name


@relax.expr_functor.mutator
class _FoldQDQ(relax.PyExprMutator):
    """The spelling `_SpellQDQ` writes, back into relax.quantize / relax.dequantize."""

    def _value(self, e):
        if isinstance(e, relax.Var):
            return self.lookup_binding(e)  # None for a parameter: TVM returns it, raising nothing
        return e

    def _f32(self, e):
        arr = _scalar_param(e, ("float32",))
        return None if arr is None else float(arr)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        folded = None
        if _call(call, "relax.astype"):
            folded = self._quantize(call)
        elif _call(call, "relax.multiply"):
            folded = self._dequantize(call)
        return call if folded is None else folded

    def _quantize(self, cast):
        out = str(cast.attrs.dtype)
        if out not in _QTYPES:
            return None
        mn = self._value(cast.args[0])
        mx = self._value(mn.args[0]) if _call(mn, "relax.minimum") else None
        add = self._value(mx.args[0]) if _call(mx, "relax.maximum") else None
        rnd = self._value(add.args[0]) if _call(add, "relax.add") else None
        div = self._value(rnd.args[0]) if _call(rnd, "relax.round") else None
        if not _call(div, "relax.divide"):
            return None
        info = np.iinfo(out)
        s, zp = self._f32(div.args[1]), self._f32(add.args[1])
        if (s is None or zp is None or self._f32(mx.args[1]) != info.min
                or self._f32(mn.args[1]) != info.max or _dtype(div.args[0]) != "float32"):
            return None
        return relax.op.quantize(div.args[0], relax.const(np.float32(s), "float32"),
                                 relax.const(np.array(zp).astype(out), out), axis=-1,
                                 out_dtype=out)

    def _dequantize(self, mul):
        sub = self._value(mul.args[0])
        cast = self._value(sub.args[0]) if _call(sub, "relax.subtract") else None
        if not (_call(cast, "relax.astype") and str(cast.attrs.dtype) == "float32"):
            return None
        q = cast.args[0]
        s, zp = self._f32(mul.args[1]), self._f32(sub.args[1]) if sub is not None else None
        if s is None or zp is None or _dtype(q) not in _QTYPES:
            return None
        return relax.op.dequantize(q, relax.const(np.float32(s), "float32"),
                                   relax.const(np.array(zp).astype(_dtype(q)), _dtype(q)),
                                   axis=-1, out_dtype="float32")


def _function_pass(mutator_cls, name):
    @tvm.transform.module_pass(opt_level=0, name=name)
    def run(mod, _ctx):
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gv] = mutator_cls(mod).visit_expr(func)
        return relax.transform.DeadCodeElimination()(mod)

    return run


SpellQDQ = _function_pass(_SpellQDQ, "tvmopt.SpellQDQ")
Conv1dAsConv2d = _function_pass(_Conv1dAsConv2d, "tvmopt.Conv1dAsConv2d")
FoldQDQ = _function_pass(_FoldQDQ, "tvmopt.FoldQDQ")
