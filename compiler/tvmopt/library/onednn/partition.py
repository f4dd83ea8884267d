"""Which chains oneDNN takes: `partition` groups each into a composite function (one per
call site), `workload_key` names its workload, and `dispatch_onednn` partitions and lowers a
whole module (every chain on the library)."""

from __future__ import annotations


import tvm
from tvm import relax

from ...codegen.layout import channels_last, lift_clip
from .checks import _check_attention, _check_bmm, _check_conv, _check_matmul
from .common import _composite_ops, _use_counts
from .extension import QDQ_WEIGHTS_ATTR, _PREFIX
from .int8 import _private_dynamic, _restore_qdq, has_integer_conv, has_integer_matmul, strip_qdq_weights
from .int8_patterns import _check_dqconv, _check_dqmatmul, _check_qconv, _check_qmatmul, _dqconv_patterns, _dqmatmul_patterns, _qconv_patterns, _qmatmul_patterns
from .patterns import _attention_patterns, _bmm_patterns, _conv_patterns, _matmul_patterns


@relax.expr_functor.mutator
class _SingleUseFirst(relax.PyExprMutator):
    """Put the single-use operand of an add first.

    In add(convA, convB) where convA's output also feeds another op, only convB can absorb
    the add as a residual post-op; the matcher takes the first operand as the chain and
    does not retry the other order when the check rejects the leak.
    """

    def __init__(self, mod, counts):
        super().__init__(mod)
        self.counts = counts

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.add" and all(
                isinstance(a, relax.Var) for a in call.args):
            a, b = call.args
            if self.counts.get(a, 0) > 1 and self.counts.get(b, 0) == 1:
                return relax.op.add(b, a)
        return call


def _prepare(mod: tvm.IRModule, conv: bool, nhwc: bool) -> tvm.IRModule:
    if conv:
        # Before ConvertLayout too: it cannot see through call_tir and would wrap every
        # ReLU6 in a pair of transposes.
        mod = lift_clip(mod)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gv] = _SingleUseFirst(mod, _use_counts(func)).visit_expr(func)
    if conv and nhwc:
        # The weight transposes fold back into constants: the patterns need a constant weight.
        mod = tvm.ir.transform.Sequential(channels_last("OHWI"))(mod)
    return mod


def partition(mod: tvm.IRModule, conv: bool = True, matmul: bool = True,
              nhwc: bool = False, int8: bool = False) -> tvm.IRModule:
    """Group every chain oneDNN can take into a composite function (one per call site), for
    `lower` to turn into packed calls; nothing else changes.

    Args:
        int8: group a QDQ model's quantized convolutions / matmuls (whose int8 weights
            `record_qdq_weights` noted), and a dynamically quantized model's integer matmuls
            (``qmatmul_dynamic*``), for the int8 kernels; only for a CPU with one of
            INT8_FEATURES. Those the int8 patterns do not take are offered to the fp32 ones.
    """
    mod = _prepare(mod, conv, nhwc)
    if int8 and mod.get_attr(QDQ_WEIGHTS_ATTR):
        mod = _restore_qdq(mod)
        qpats = []
        if conv:
            qpats += [relax.transform.FusionPattern(n, p, ann, _check_qconv)
                      for n, p, ann in _qconv_patterns()]
        if matmul:
            qpats += [relax.transform.FusionPattern(n, p, ann, _check_qmatmul)
                      for n, p, ann in _qmatmul_patterns()]
        mod = relax.transform.FuseOpsByPattern(qpats, bind_constants=False)(mod)
        # Weights the int8 patterns did not take fold back into fp32 constants, and the copies
        # of shared quantize/dequantize pairs merge again.
        mod = tvm.ir.transform.Sequential([relax.transform.FoldConstant(),
                                           relax.transform.EliminateCommonSubexpr(),
                                           relax.transform.DeadCodeElimination()])(mod)
    dynamic_conv = int8 and conv and has_integer_conv(mod)
    if dynamic_conv or (int8 and matmul and has_integer_matmul(mod)):
        # onnxruntime quantize_dynamic models: MatMulInteger / ConvInteger on a
        # DynamicQuantizeLinear input.
        mod = _private_dynamic(mod)
        pats = [relax.transform.FusionPattern(n, p, ann, _check_dqconv)
                for n, p, ann in (_dqconv_patterns() if dynamic_conv else [])]
        pats += [relax.transform.FusionPattern(n, p, ann, _check_dqmatmul)
                 for n, p, ann in (_dqmatmul_patterns() if matmul else [])]
        mod = relax.transform.FuseOpsByPattern(pats, bind_constants=False)(mod)
        mod = tvm.ir.transform.Sequential([relax.transform.EliminateCommonSubexpr(),
                                           relax.transform.DeadCodeElimination()])(mod)
    mod = strip_qdq_weights(mod)
    patterns = []
    if conv:
        patterns += [relax.transform.FusionPattern(n, p, ann, _check_conv)
                     for n, p, ann in _conv_patterns()]
    if matmul:
        patterns += [relax.transform.FusionPattern(n, p, ann, _check_matmul)
                     for n, p, ann in _matmul_patterns()]
        # Before the single matmuls: the first pattern that matches takes its ops.
        patterns += [relax.transform.FusionPattern(n, p, ann, _check_attention)
                     for n, p, ann in _attention_patterns()]
        patterns += [relax.transform.FusionPattern(n, p, ann, _check_bmm)
                     for n, p, ann in _bmm_patterns()]
    if not patterns:
        return mod
    # bind_constants=False keeps weights as call arguments, so they become arguments of the
    # packed call instead of being buried in a function nobody legalizes.
    return relax.transform.FuseOpsByPattern(patterns, bind_constants=False)(mod)


def composites(mod: tvm.IRModule) -> dict:
    """GlobalVar -> composite function, for every oneDNN group `partition` made."""
    return {gv: f for gv, f in mod.functions.items()
            if isinstance(f, relax.Function) and f.attrs is not None
            and str(f.attrs.get("Composite", "")).startswith(_PREFIX)}


def workload_key(func: relax.Function) -> str:
    """What a composite computes, independent of its weights: pattern, shapes, attributes."""
    anchor = next(c for _, c in _composite_ops(func)
                  if c.op.name in ("relax.nn.conv2d", "relax.matmul"))
    shapes = [str(p.ty) for p in func.params]
    attrs = anchor.attrs
    fields = ("strides", "padding", "dilation", "groups", "data_layout", "kernel_layout",
              "transpose_a", "transpose_b")
    attr_text = ",".join(f"{k}={getattr(attrs, k)}" for k in fields if hasattr(attrs, k))
    return "|".join([str(func.attrs["Composite"])[len(_PREFIX):], *shapes, str(func.ret_ty),
                     attr_text])


def is_conv(func: relax.Function) -> bool:
    """A composite around a 2-D convolution (fp32/bf16 or int8)."""
    return any(isinstance(c, relax.Call) and isinstance(c.op, tvm.ir.Op)
               and c.op.name == "relax.nn.conv2d" for _, c in _composite_ops(func))


def is_quantized(func: relax.Function) -> bool:
    """A composite for the int8 kernels (qconv2d / qmatmul)."""
    return str(func.attrs.get("Composite", "")).startswith(_PREFIX + "q")


def is_dynamic(func: relax.Function) -> bool:
    """A composite for a dynamically quantized integer matmul or convolution
    (qmatmul_dynamic, qconv2d_dynamic)."""
    return str(func.attrs.get("Composite", "")).startswith(
        (_PREFIX + "qmatmul_dynamic", _PREFIX + "qconv2d_dynamic"))
