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


def _const_array(e) -> np.ndarray | None:
    """Value of a tensor constant (TVM 0.27 spells it GenericConst with a Tensor .value)."""
    if isinstance(e, tvm.ir.expr.Constant) and isinstance(getattr(e, "value", None),
                                                          tvm.runtime.Tensor):
        return e.value.numpy()
    return None


def _static_f32_shape(expr) -> list[int] | None:
    sinfo = expr.ty
    if not isinstance(sinfo, relax.TensorType) or sinfo.dtype != "float32":
        return None
    if sinfo.shape is None or not isinstance(sinfo.shape, relax.ShapeExpr):
        return None
    dims = []
    for d in sinfo.shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            return None
        dims.append(int(d))
    return dims


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
        carr = _const_array(c)
        if carr is None or carr.size != 1 or carr.dtype != np.float32:
            return call
        if _static_f32_shape(x) is None:
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


def channels_last(kernel_layout: str = "HWIO") -> list:
    """Passes (before LegalizeOps) moving conv2d to NHWC with `kernel_layout` weights.

    Only modules with a conv2d change. ConvertLayout refuses some graphs (a match_cast of a
    data-dependent shape: "exactly one of the layouts is unknown"); those keep their layout.
    """
    # conv2d_transpose is pinned to NCHW: it would otherwise follow its NHWC producer, and
    # TVM's legalizer lowers only NCHW/IOHW, leaving an op the VM codegen cannot emit.
    desired = {"relax.nn.conv2d": ["NHWC", kernel_layout],
               "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}
    convert = tvm.ir.transform.Sequential([
        LiftClip, relax.transform.ConvertLayout(desired),
        relax.transform.Normalize(), relax.transform.FoldConstant()])

    @tvm.transform.module_pass(opt_level=0, name="tvmopt.ChannelsLast")
    def channels_last_pass(mod, _ctx):
        if not _has_conv2d(mod):
            return mod
        try:
            return convert(mod)
        except Exception:  # noqa: BLE001 - TVM raises InternalError subclasses
            return mod

    return [channels_last_pass]


def _has_conv2d(mod) -> bool:
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and \
                e.op.name == "relax.nn.conv2d":
            found.append(e)

    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return bool(found)
