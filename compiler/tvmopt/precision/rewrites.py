"""Precision rewrites chosen by the plan, as Relax passes for `PipelineConfig.precision_passes`.

- fp16: `relax.transform.ToMixedPrecision(out_dtype="float32")` (fp16 inputs, fp32 accumulation).
- int8_weight: each fp32 matmul with a constant 2-D weight that the plan's rule picks
  (`schemes.int8_weight_wins`, memory-bound and predicted faster) becomes one TE kernel reading int8
  weights and one fp32 scale per output column; the dequantization happens inside the matmul loop
  (weights quantized offline, symmetric per column).
- int8 refused on a pre-quantized model: integer matmuls (int32 x int32 -> int32, what TVM's
  MatMulInteger converter emits) are computed in fp32; the int8 weights become fp32 constants.
"""

from __future__ import annotations

import numpy as np

from .. import fallbacks
from ..targets.registry import HardwareTarget


def quantize_weight(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-column int8 quantization of a [K, N] weight: w ~= q * scale[None, :]."""
    amax = np.abs(w).max(axis=0)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.round(w / scale[None, :]), -127, 127).astype(np.int8)
    return q, scale


def _int8_matmul_te(x, wq_t, scale):
    """y[i, j] = scale[j] * sum_k x[i, k] * float(wq_t[j, k]); weights stored [N, K] so each
    output column reads its int8 weights contiguously."""
    from tvm import te

    m, k = x.shape
    n = wq_t.shape[0]
    r = te.reduce_axis((0, k), name="k")
    acc = te.compute((m, n), lambda i, j: te.sum(x[i, r] * wq_t[j, r].astype("float32"), axis=r),
                     name="matmul_w8")
    return te.compute((m, n), lambda i, j: acc[i, j] * scale[j], name="dequant_scale")


def _rewrite_calls(mod, ops: tuple[str, ...], rewrite, lookup: bool = False):
    """Apply `rewrite(builder, call) -> Expr | None` (None: keep) to every call of the Relax ops
    named in `ops`, in every Relax function of `mod`. With `lookup`, rewrite is called as
    rewrite(builder, call, bound), bound(var) giving the value bound to a var (or None)."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class Rewrite(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if isinstance(call.op, tvm.ir.Op) and call.op.name in ops:
                new = (rewrite(self.builder_, call, self._bound) if lookup
                       else rewrite(self.builder_, call))
                if new is not None:
                    return new
            return call

        def _bound(self, e):
            if not isinstance(e, relax.Var):
                return None
            return self.lookup_binding(e)  # None for a parameter: TVM returns it, raising nothing

    rw = Rewrite(mod)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            rw.builder_.update_func(gv, rw.visit_expr(func))
    return rw.builder_.get()


def int8_weight_pass(hw: HardwareTarget, force: bool = False, wins=None):
    """Weight-only int8 for the matmuls the roofline rule `wins(m, k, n)` picks on `hw` (every
    one when `force`: an explicit --precision int8)."""
    import tvm
    from tvm import relax

    def rewrite(builder, call):
        x, w = call.args
        if not isinstance(w, tvm.ir.expr.Constant) or len(w.value.shape) != 2:
            return None
        xshape = getattr(x.ty, "shape", None)
        dims = list(getattr(xshape, "values", None) or [])
        if len(dims) != 2 or not hasattr(dims[1], "value"):
            return None  # batched (3-D) or unknown activations: keep fp32
        if str(w.value.dtype) != "float32":
            return None
        # a symbolic row count is judged at 1, as the plan binds symbolic dims (default 1)
        m = int(dims[0].value) if hasattr(dims[0], "value") else 1
        k = int(dims[1].value)
        n = int(w.value.shape[1])
        if not force and not (wins and wins(m, k, n)):
            return None
        q, scale = quantize_weight(w.value.numpy())
        q_t = np.ascontiguousarray(q.T)
        return builder.call_te(_int8_matmul_te, x, relax.const(q_t), relax.const(scale),
                               primfunc_name_hint="matmul_w8")

    @tvm.transform.module_pass(opt_level=0, name="tvmopt.Int8WeightOnly")
    def transform(mod, _ctx):
        return _rewrite_calls(mod, ("relax.matmul",), rewrite)

    return transform


def _is_op(e, name) -> bool:
    import tvm
    from tvm import relax

    return isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == name


def _dynamic_int8_matmul(call, bound) -> bool:
    """MatMulInteger of a DynamicQuantizeLinear input and a constant weight that fits int8, as
    imported: what the oneDNN int8 library kernels take (library.onednn qmatmul_dynamic)."""
    import tvm

    sub = bound(call.args[0])
    if not _is_op(sub, "relax.subtract"):
        return False
    wide = bound(sub.args[0])
    if not (_is_op(wide, "relax.astype") and _is_op(bound(wide.args[0]), "relax.quantize")):
        return False
    w = call.args[1]
    if _is_op(bound(w), "relax.subtract"):  # the weight minus its zero point
        w = bound(w).args[0]
    value = getattr(w, "value", None)  # TVM 0.27's GenericConst holds a Tensor .value
    if not isinstance(value, tvm.runtime.Tensor):
        return False
    arr = value.numpy()
    return arr.dtype.kind in "iu" and arr.size > 0 and arr.min() >= -128 and arr.max() <= 127


def integer_matmul_to_fp32_pass(keep_library_int8: bool = False):
    """Compute int32 matmuls in fp32 (exact while sums stay below 2^24; rounded back to int32).

    Args:
        keep_library_int8: leave integer the matmuls oneDNN's int8 kernels take (dynamically
            quantized ones with an int8 weight), for the dispatch phase after this one.
    """
    import tvm
    from tvm import relax

    def rewrite(builder, call, bound=None):
        if str(call.attrs.out_dtype) != "int32":
            return None
        if keep_library_int8 and _dynamic_int8_matmul(call, bound):
            return None
        a, b = (relax.op.astype(v, "float32") for v in call.args)
        y = relax.op.matmul(a, b, out_dtype="float32")
        return relax.op.astype(relax.op.round(y), "int32")

    @tvm.transform.module_pass(opt_level=0, name="tvmopt.IntegerMatmulToFP32")
    def transform(mod, _ctx):
        return _rewrite_calls(mod, ("relax.matmul",), rewrite, lookup=keep_library_int8)

    return transform


def _matrix_ops_fp16(mod):
    """fp16 inputs, fp32 accumulation/output for every fp32 matmul and conv2d (the rest stays fp32)."""
    from tvm import relax

    def rewrite(builder, call):
        if any(str(getattr(a.ty, "dtype", "")) != "float32" for a in call.args[:2]):
            return None
        a, b = (relax.op.astype(v, "float16") for v in call.args[:2])
        if call.op.name == "relax.matmul":
            return relax.op.matmul(a, b, out_dtype="float32")
        at = call.attrs
        return relax.op.nn.conv2d(a, b, strides=at.strides, padding=at.padding,
                                  dilation=at.dilation, groups=at.groups,
                                  data_layout=at.data_layout, kernel_layout=at.kernel_layout,
                                  out_layout=at.out_layout, out_dtype="float32")

    return _rewrite_calls(mod, ("relax.matmul", "relax.nn.conv2d"), rewrite)


def fp16_pass():
    """Relax ToMixedPrecision (fp16, fp32 accumulation). TVM 0.27's pass rejects modules whose
    main calls TIR directly (call_tir, which the ONNX importer emits for Clip); those get the
    same treatment for matmul/conv2d only, the ops that run on tensor cores (recorded as a
    fallback: the other ops stay fp32)."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="tvmopt.MixedPrecisionFP16")
    def transform(mod, _ctx):
        try:
            return relax.transform.ToMixedPrecision(out_dtype="float32")(mod)
        except Exception as err:  # noqa: BLE001 - TVM raises InternalError on call_tir arguments
            fallbacks.record("precision_rewrite", "relax.transform.ToMixedPrecision", err,
                             instead="fp16 for matmul and conv2d only; every other op stays fp32")
            return _matrix_ops_fp16(mod)

    return transform
