"""MatMul and Softmax on float16/bfloat16 tensors, rounded where the ONNX reference rounds.

TVM computes a float16 MatMul with a float16 accumulator and a float16 Softmax through its
fused float16 kernel; both drift several ulps from the spec's reference (and onnxruntime),
which accumulates matmuls in float32 and rounds once. The reference Softmax is numpy in the
input type: `x - max` and `exp` round to the type, the row sum accumulates in float32 for
float16 (numpy's pairwise sum) but in bfloat16 for bfloat16 (ml_dtypes adds sequentially),
and the division rounds to the type. The helpers below follow exactly that, so Attention and
the graphs exporters write for it (MatMul -> Softmax -> MatMul) match float16 to within an ulp.
bfloat16 can still differ by an ulp where a mask is added: TVM legalizes bfloat16 arithmetic
inside a fused kernel in float32 and rounds only at stores (even an explicit
astype(bfloat16) -> astype(float32) round trip is folded away), so intermediates keep bits the
reference rounds off.
"""

from __future__ import annotations

from . import register, tvm_converter

LOW = ("float16", "bfloat16")


def dtype_of(x) -> str:
    return str(x.ty.dtype)


def matmul(bb, a, b):
    """a @ b; float16/bfloat16 accumulate in float32 and round once, as the reference does."""
    from tvm import relax

    a, b = bb.normalize(a), bb.normalize(b)
    dtype = dtype_of(a)
    if dtype in LOW and dtype_of(b) == dtype:
        return relax.op.astype(relax.op.matmul(a, b, out_dtype="float32"), dtype)
    return relax.op.matmul(a, b)


def softmax(bb, x, axis: int):
    """Softmax over `axis`; for float16/bfloat16 the reference's rounding steps."""
    from tvm import relax

    x = bb.normalize(x)
    dtype = dtype_of(x)
    if dtype not in LOW:
        return relax.op.nn.softmax(x, axis=axis)
    shifted = bb.normalize(relax.op.subtract(x, relax.op.max(x, axis=axis, keepdims=True)))
    e = bb.normalize(relax.op.astype(relax.op.exp(relax.op.astype(shifted, "float32")), dtype))
    if dtype == "float16":
        total = relax.op.astype(relax.op.sum(relax.op.astype(e, "float32"), axis=axis,
                                             keepdims=True), dtype)
    else:  # a bfloat16 accumulator, added in order: what ml_dtypes' numpy sum does
        total = relax.op.sum(e, axis=axis, keepdims=True)
    return relax.op.divide(e, bb.normalize(total))


@register("MatMul")
def mat_mul(bb, inputs, attr, params, opset):
    return matmul(bb, inputs[0], inputs[1])


@register("Softmax")
class Softmax:
    """Opset 13+ float16/bfloat16 softmax in reference rounding; anything else: TVM's."""

    @classmethod
    def get_converter(cls, opset):
        base = tvm_converter("Softmax", opset)
        if opset < 13:  # the flatten-to-2-D semantics of Softmax-1/11 stay with TVM's converter
            return base

        def convert(bb, inputs, attr, params):
            if dtype_of(inputs[0]) not in LOW:
                return base(bb, inputs, attr, params)
            return softmax(bb, inputs[0], attr.get("axis", -1))

        return convert
