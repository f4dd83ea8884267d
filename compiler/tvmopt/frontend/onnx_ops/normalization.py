"""LayerNormalization with its Mean / InvStdDev outputs.

TVM's converter returns 0-d zero placeholders for outputs 1 and 2, which silently gives wrong
results to any graph that reads them (training-exported graphs, the ONNX function tests). When
those outputs are used they are computed here; otherwise the fused `nn.layer_norm` is kept.
"""

from __future__ import annotations

from . import register


def _onnx_dtype(code: int) -> str:
    from onnx import helper

    return str(helper.tensor_dtype_to_np_dtype(code))


@register("LayerNormalization")
def layer_normalization(bb, inputs, attr, params, opset):
    from tvm import relax

    data, scale, bias = inputs[0], inputs[1], inputs[2]
    ty = data.ty
    rank = ty.ndim
    if rank is None or rank < 0:
        raise ValueError("LayerNormalization needs a known input rank")
    axis = attr.get("axis", -1)
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        raise ValueError(f"LayerNormalization axis {attr.get('axis')} out of range for rank {rank}")
    axes = list(range(axis, rank))
    eps = float(attr.get("epsilon", 1e-5))
    dtype = str(ty.dtype)
    stash = _onnx_dtype(attr.get("stash_type", 1))
    n_out = attr.get("tvm_custom", {}).get("num_outputs", 1)

    if n_out == 1 and str(scale.ty.dtype) == dtype and scale.ty.ndim == len(axes) and \
            (bias is None or bias.ty.ndim == len(axes)):
        if bias is None:
            bias = relax.op.zeros_like(scale)
        return relax.op.nn.layer_norm(data, scale, bias, axes, eps)

    # Explicit form, in the stash type (float32 by default), as the ONNX function body does.
    x = relax.op.astype(data, stash) if stash != dtype else data
    mean = bb.normalize(relax.op.mean(x, axes, keepdims=True))
    centered = bb.normalize(relax.op.subtract(x, mean))
    var = relax.op.mean(relax.op.multiply(centered, centered), axes, keepdims=True)
    inv_std = bb.normalize(relax.op.rsqrt(relax.op.add(var, relax.const(eps, stash))))
    normed = relax.op.multiply(centered, inv_std)
    if stash != dtype:
        normed = relax.op.astype(normed, dtype)
    y = relax.op.multiply(normed, scale)
    if bias is not None:
        y = relax.op.add(y, bias)
    return relax.Tuple([bb.normalize(y), mean, inv_std])


@register("RMSNormalization")
def rms_normalization(bb, inputs, attr, params, opset):
    """RMSNormalization by its definition; TVM's fused rms_norm fails when the scale's rank
    differs from the number of normalized axes (a broadcastable scale)."""
    from tvm import relax

    data, scale = inputs[0], inputs[1]
    rank = data.ty.ndim
    if rank is None or rank < 0:
        raise ValueError("RMSNormalization needs a known input rank")
    axis = attr.get("axis", -1)
    axis = axis + rank if axis < 0 else axis
    axes = list(range(axis, rank))
    eps = float(attr.get("epsilon", 1e-5))
    dtype = str(data.ty.dtype)
    stash = _onnx_dtype(attr.get("stash_type", 1))
    x = relax.op.astype(data, stash) if stash != dtype else data
    ms = relax.op.mean(relax.op.multiply(x, x), axes, keepdims=True)
    normed = relax.op.multiply(x, relax.op.rsqrt(relax.op.add(ms, relax.const(eps, stash))))
    if stash != dtype:
        normed = relax.op.astype(normed, dtype)
    return relax.op.multiply(normed, scale)
