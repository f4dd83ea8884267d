"""A QDQ model's int8 weights, kept for oneDNN's int8 kernels.

`record_qdq_weights` (before constant folding) notes each weight that is the dequantize of an
int8 constant; the partition puts those int8 weights back in front of the convolutions and
matmuls whose input is a quantize/dequantize pair. Also: which hosts int8 kernels are offered
on, and whether a module has a dynamically quantized model's integer matmuls / convolutions.
"""

from __future__ import annotations

import itertools

import numpy as np
import tvm
from tvm import relax

from ...passes.values import const_array
from .common import _binding_of, _is
from .extension import INT8_FEATURES, QDQ_WEIGHTS_ATTR


def int8_unavailable(features) -> str | None:
    """Why int8 library kernels are not offered on a CPU with these flags; None if they are."""
    if any(f in features for f in INT8_FEATURES):
        return None
    return ("no int8 dot-product instructions (needs " + ", ".join(INT8_FEATURES) +
            "); QDQ convolutions and matmuls stay fp32")


def _dequantized_weight(call) -> bool:
    if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
            and call.op.name == "relax.dequantize"):
        return False
    q, scale, zp = (const_array(a) for a in call.args[:3])
    return (q is not None and q.dtype == np.int8 and scale is not None
            and scale.dtype == np.float32 and zp is not None and not zp.any())


def record_qdq_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """Note every dequantize of an int8 constant (zero point 0) in a module attribute.

    FoldConstant turns them into fp32 constants, and ConvertLayout then transposes those;
    `partition` finds them again by value to give the int8 kernels their int8 weights.
    """
    found = []

    def visit(e):
        if _dequantized_weight(e):
            found.append([e.args[0].value, e.args[1].value, int(e.attrs.axis)])

    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return mod.with_attr(QDQ_WEIGHTS_ATTR, found) if found else mod


@tvm.transform.module_pass(opt_level=0, name="tvmopt.RecordQDQWeights")
def RecordQDQWeights(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    return record_qdq_weights(mod)


def strip_qdq_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """The module without the recorded int8 weights (they must not reach the build)."""
    return mod.without_attr(QDQ_WEIGHTS_ATTR) if mod.get_attr(QDQ_WEIGHTS_ATTR) else mod


class _WeightTable:
    """Recorded int8 weights, looked up by the fp32 constant they fold to, in any axis order."""

    def __init__(self, entries):
        self.entries = []
        for q, scale, axis in entries:
            q, scale = q.numpy(), scale.numpy()
            shape = [1] * q.ndim
            if scale.size > 1:
                shape[int(axis) % q.ndim] = scale.size
            deq = (q.astype(np.float32) * scale.reshape(shape)).astype(np.float32)
            self.entries.append((q, scale, int(axis) % q.ndim, deq))

    def find(self, w: np.ndarray):
        """(int8 weight laid out as w, scales, axis of the scales in w) or None."""

        for q, scale, axis, deq in self.entries:
            if sorted(deq.shape) != sorted(w.shape):
                continue
            for perm in itertools.permutations(range(w.ndim)):
                if tuple(deq.shape[p] for p in perm) != w.shape:
                    continue
                if np.allclose(deq.transpose(perm), w, rtol=1e-6, atol=0):
                    return np.ascontiguousarray(q.transpose(perm)), scale, perm.index(axis)
        return None


@relax.expr_functor.mutator
class _QDQOperands(relax.PyExprMutator):
    """conv2d / matmul operands of a QDQ model made matchable by the int8 patterns.

    The weight: its recorded int8 constant dequantized again, in the layout the fp32 constant
    has now (the legalized build folds it back). The input: a private copy of its
    quantize -> dequantize [-> transpose] chain, since one pair often feeds several consumers
    (a block input, a residual) and a fused group may not share its intermediates.
    """

    def __init__(self, mod, table):
        super().__init__(mod)
        self.table = table

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (_is(call, "relax.nn.conv2d") or _is(call, "relax.matmul")):
            return call
        x = self._private_qdq(call.args[0])
        w = const_array(call.args[1])
        if x is None or w is None or w.dtype != np.float32:
            return call
        found = self.table.find(w)
        if found is None:
            return call
        q, scale, axis = found
        zp = np.zeros(scale.shape, np.int8)
        weight = relax.op.dequantize(relax.const(q, "int8"), relax.const(scale, "float32"),
                                     relax.const(zp, "int8"), axis=axis, out_dtype="float32")
        return relax.Call(call.op, [x, weight], call.attrs, call.ty_args)

    def _private_qdq(self, x):
        chain = []
        e = _binding_of(self, x)
        if _is(e, "relax.permute_dims"):
            chain.append(e)
            e = _binding_of(self, e.args[0])
        if not _is(e, "relax.dequantize"):
            return None
        deq, quant = e, _binding_of(self, e.args[0])
        if not _is(quant, "relax.quantize"):
            return None
        out = relax.Call(quant.op, quant.args, quant.attrs, quant.ty_args)
        out = relax.Call(deq.op, [out, *deq.args[1:]], deq.attrs, deq.ty_args)
        for c in chain:
            out = relax.Call(c.op, [out, *c.args[1:]], c.attrs, c.ty_args)
        return out


@relax.expr_functor.mutator
class _DynamicOperands(relax.PyExprMutator):
    """Integer matmuls of a dynamically quantized model, each given a private copy of its
    input's quantize -> widen -> minus zero point chain: onnxruntime quantizes an activation
    once for all the matmuls reading it (Q, K and V of an attention block), and a fused group
    may not share its intermediates. Copies the int8 patterns leave are merged again."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if _is(call, "relax.matmul"):
            if str(call.attrs.out_dtype) != "int32":
                return call
        elif not _int32_conv(call):
            return call
        # A convolution's input may be transposed into its layout, and the quantize's input
        # out of it (ConvertLayout's doing): those transposes are copied too.
        into = _binding_of(self, call.args[0])
        into = into if _is(call, "relax.nn.conv2d") and _is(into, "relax.permute_dims") else None
        sub = _binding_of(self, into.args[0] if into is not None else call.args[0])
        if not _is(sub, "relax.subtract"):
            return call
        wide, zp = (_binding_of(self, a) for a in sub.args)
        if not (_is(wide, "relax.astype") and _is(zp, "relax.astype")):
            return call
        quant = _binding_of(self, wide.args[0])
        if not _is(quant, "relax.quantize"):
            return call
        copy = lambda c, *args: relax.Call(c.op, list(args), c.attrs, c.ty_args)  # noqa: E731
        lead = _binding_of(self, quant.args[0]) if into is not None else None
        data = copy(lead, *lead.args) if _is(lead, "relax.permute_dims") else quant.args[0]
        q = copy(quant, data, *quant.args[1:])
        x = copy(sub, copy(wide, q), copy(zp, *zp.args))
        if into is not None:
            x = copy(into, x)
        return relax.Call(call.op, [x, *call.args[1:]], call.attrs, call.ty_args)


def _private_dynamic(mod: tvm.IRModule) -> tvm.IRModule:
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = _DynamicOperands(mod).visit_expr(func)
    return mod


def _restore_qdq(mod: tvm.IRModule) -> tvm.IRModule:
    entries = mod.get_attr(QDQ_WEIGHTS_ATTR)
    if not entries:
        return mod
    table = _WeightTable(entries)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = _QDQOperands(mod, table).visit_expr(func)
    return relax.transform.DeadCodeElimination()(mod)


def has_integer_matmul(mod: tvm.IRModule) -> bool:
    """The module has int32 matmuls (a dynamically quantized model's MatMulInteger)."""
    found = []

    def visit(e):
        if _is(e, "relax.matmul") and str(e.attrs.out_dtype) == "int32":
            found.append(e)

    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return bool(found)


def _int32_conv(e) -> bool:
    if not _is(e, "relax.nn.conv2d"):
        return False
    out = str(e.attrs.out_dtype or "")  # "" / None: the input's type
    return (out or str(e.args[0].ty.dtype)) == "int32"


def has_integer_conv(mod: tvm.IRModule) -> bool:
    """The module has int32 convolutions (a dynamically quantized model's ConvInteger)."""
    found = []

    def visit(e):
        if _int32_conv(e):
            found.append(e)

    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return bool(found)
