"""ONNX Attention (opset 23+), following the spec's reference implementation.

TVM's map has only com.microsoft's Attention under that name (packed QKV weights, `num_heads`),
so every ai.onnx Attention failed. This converter covers 3-D and 4-D Q/K/V, KV cache
(past_key/past_value -> present_*), grouped-query heads, boolean or additive masks (padded to
the KV length), causal masking aligned to the cache, softcap, softmax_precision and the four
qk_matmul_output modes, nonpad_kv_seqlen (opset 24 external cache: per-batch padding and
causal offset) and sliding windows (opset 25 left/right_window_size). float16/bfloat16 inputs
follow the reference's rounding (matmuls accumulate in float32, softmax in the input type;
`low_precision.py`), not TVM's float16 accumulators, which drift several ulps.
"""

from __future__ import annotations

from . import low_precision, register
from .shape_values import as_shape_tensor


def _onnx_dtype(code: int) -> str:
    from onnx import helper

    return str(helper.tensor_dtype_to_np_dtype(code))


def _static(dim):
    from tvm import tirx

    return int(dim.value) if isinstance(dim, tirx.IntImm) else None


def _half_min(dtype: str):
    """Half the dtype's lowest value: a bias at or below it is a masked position."""
    import numpy as np
    from tvm import relax

    return relax.const(np.array(np.finfo(dtype).min / 2 if dtype != "bfloat16" else -1.6e38,
                                dtype=dtype), dtype)


@register("Attention")
def attention(bb, inputs, attr, params, opset):
    import numpy as np
    from tvm import relax, tirx

    q, k, v = inputs[0], inputs[1], inputs[2]
    mask, past_k, past_v = inputs[3], inputs[4], inputs[5]
    nonpad = inputs[6] if len(inputs) > 6 else None
    if nonpad is not None and past_k is not None:
        raise ValueError("Attention: nonpad_kv_seqlen cannot be combined with past_key")
    left, right = attr.get("left_window_size", -1), attr.get("right_window_size", -1)
    dtype = str(q.ty.dtype)
    rank = q.ty.ndim
    q_heads, kv_heads = attr.get("q_num_heads"), attr.get("kv_num_heads")

    def to_4d(x, heads):
        b, s, hidden = x.ty.shape.values
        x = relax.op.reshape(x, relax.ShapeExpr([b, s, tirx.IntImm("int64", heads),
                                                 tirx.floordiv(hidden, heads)]))
        return bb.normalize(relax.op.permute_dims(x, [0, 2, 1, 3]))

    if rank == 3:
        if q_heads is None or kv_heads is None:
            raise ValueError("3-D Attention needs q_num_heads and kv_num_heads")
        q, k, v = to_4d(q, q_heads), to_4d(k, kv_heads), to_4d(v, kv_heads)
    elif rank != 4:
        raise ValueError(f"Attention expects 3-D or 4-D Q, got rank {rank}")

    present_k = bb.normalize(relax.op.concat([past_k, k], axis=2)) if past_k is not None else k
    present_v = bb.normalize(relax.op.concat([past_v, v], axis=2)) if past_v is not None else v
    k, v = present_k, present_v
    q_len, kv_len = q.ty.shape.values[2], k.ty.shape.values[2]
    head = _static(q.ty.shape.values[3])

    scale = attr.get("scale")
    if scale is None:
        if head is None:
            raise ValueError("Attention without `scale` needs a static head size")
        scale = 1.0 / np.sqrt(head)
    root = relax.const(np.array(np.sqrt(scale), dtype=dtype), dtype)

    # Masked scores use the dtype's lowest finite value rather than -inf: exp() still gives
    # exactly 0, and LLVM's fast-math code (no-infs) then keeps the row checks below sound.
    neg_inf = relax.const(np.array(np.finfo(dtype).min if dtype != "bfloat16" else -3.38e38,
                                   dtype=dtype), dtype)
    zero = relax.const(np.array(0, dtype=dtype), dtype)
    bias = None
    if mask is not None:
        mask_len = mask.ty.shape.values[-1]
        pad = _static(kv_len) - _static(mask_len) if _static(kv_len) is not None and \
            _static(mask_len) is not None else 0
        if pad > 0:  # the spec pads a short mask with "masked" up to the KV length
            mshape = list(mask.ty.shape.values[:-1]) + [tirx.IntImm("int64", pad)]
            fill = relax.const(False, "bool") if str(mask.ty.dtype) == "bool" else neg_inf
            mask = bb.normalize(relax.op.concat(
                [mask, relax.op.broadcast_to(fill, relax.ShapeExpr(mshape))], axis=-1))
        if str(mask.ty.dtype) == "bool":
            bias = bb.normalize(relax.op.where(mask, zero, neg_inf))
        else:
            bias = mask if str(mask.ty.dtype) == dtype else relax.op.astype(mask, dtype)
    if nonpad is not None:  # (batch,) -> (batch, 1, 1, 1), against (batch, heads, q, kv)
        nonpad_4d = bb.normalize(relax.op.reshape(
            bb.normalize(relax.op.astype(nonpad, "int64")), [-1, 1, 1, 1]))
    # Causal and sliding-window masks are bottom-right aligned: query i sits at absolute
    # position i + offset, offset = the past length (internal cache), or per batch
    # nonpad_kv_seqlen[b] - q_len (external cache, shape (batch, 1, 1, 1)).
    if attr.get("is_causal", 0) or left >= 0 or right >= 0:
        rows = relax.op.reshape(relax.op.arange(0, q_len, 1, "int64"),
                                relax.ShapeExpr([q_len, 1]))
        cols = relax.op.reshape(relax.op.arange(0, kv_len, 1, "int64"),
                                relax.ShapeExpr([1, kv_len]))
        if nonpad is not None:
            offset = relax.op.subtract(nonpad_4d, as_shape_tensor(bb, q_len))
            pos = bb.normalize(relax.op.add(rows, offset))
        elif past_k is not None:
            pos = bb.normalize(relax.op.add(rows, as_shape_tensor(bb, past_k.ty.shape.values[2])))
        else:
            pos = rows
        diff = bb.normalize(relax.op.subtract(pos, cols))  # query position - key index
        allowed = []
        if attr.get("is_causal", 0):
            allowed.append(relax.op.greater_equal(diff, relax.const(0, "int64")))
        if left >= 0:
            allowed.append(relax.op.less_equal(diff, relax.const(left, "int64")))
        if right >= 0:
            allowed.append(relax.op.greater_equal(diff, relax.const(-right, "int64")))
        ok = allowed[0]
        for extra in allowed[1:]:
            ok = relax.op.logical_and(ok, extra)
        band = bb.normalize(relax.op.where(ok, zero, neg_inf))
        bias = band if bias is None else bb.normalize(relax.op.add(bias, band))
    if nonpad is not None:  # keys at or past nonpad_kv_seqlen[b] are padding
        cols = relax.op.reshape(relax.op.arange(0, kv_len, 1, "int64"),
                                relax.ShapeExpr([1, 1, 1, kv_len]))
        valid = relax.op.less(cols, nonpad_4d)
        pad_bias = bb.normalize(relax.op.where(valid, zero, neg_inf))
        bias = pad_bias if bias is None else bb.normalize(relax.op.add(bias, pad_bias))

    # Grouped-query attention: each KV head serves q_heads / kv_heads query heads.
    qh, kh = _static(q.ty.shape.values[1]), _static(k.ty.shape.values[1])
    if qh is not None and kh is not None and qh != kh:
        if qh % kh:
            raise ValueError(f"Attention: {qh} query heads not a multiple of {kh} KV heads")
        k = bb.normalize(relax.op.repeat(k, qh // kh, axis=1))
        v = bb.normalize(relax.op.repeat(v, qh // kh, axis=1))

    qk = low_precision.matmul(bb, relax.op.multiply(q, root),
                              relax.op.permute_dims(relax.op.multiply(k, root), [0, 1, 3, 2]))
    qk = bb.normalize(qk)
    softcap = float(attr.get("softcap", 0.0) or 0.0)
    if softcap > 0:
        cap = relax.const(np.array(softcap, dtype=dtype), dtype)
        qk = bb.normalize(relax.op.multiply(relax.op.tanh(relax.op.divide(qk, cap)), cap))
    qk_out = qk
    scores = bb.normalize(relax.op.add(qk, bias)) if bias is not None else qk
    mode = attr.get("qk_matmul_output_mode", 0)
    if mode == 2:  # masked scores as the spec has them: -inf, not our finite stand-in
        qk_out = scores if bias is None else bb.normalize(relax.op.where(
            relax.op.less_equal(bias, _half_min(dtype)),
            relax.const(np.array(-np.inf, dtype=dtype), dtype), scores))
    sm_dtype = _onnx_dtype(attr["softmax_precision"]) if "softmax_precision" in attr else dtype
    if sm_dtype != dtype:
        scores = relax.op.astype(scores, sm_dtype)
    masked_row = None
    if bias is not None:
        # A row with every key masked would softmax to NaN; the spec makes it all zeros.
        # Never create the NaN (a later select does not reliably remove it once fused):
        # give such rows finite scores, then zero their probabilities.
        masked_row = bb.normalize(relax.op.less_equal(
            relax.op.max(bias, axis=-1, keepdims=True), _half_min(dtype)))
        scores = bb.normalize(relax.op.where(
            masked_row, relax.const(np.array(0, dtype=sm_dtype), sm_dtype), scores))
    probs = bb.normalize(low_precision.softmax(bb, scores, axis=-1))
    if masked_row is not None:
        probs = bb.normalize(relax.op.where(
            masked_row, relax.const(np.array(0, dtype=sm_dtype), sm_dtype), probs))
    if mode == 3:
        qk_out = probs
    if sm_dtype != dtype:
        probs = relax.op.astype(probs, dtype)
        qk_out = relax.op.astype(qk_out, dtype) if mode == 3 else qk_out
    y = bb.normalize(low_precision.matmul(bb, probs, v))
    if rank == 3:
        b, h, s, hv = y.ty.shape.values
        y = relax.op.reshape(relax.op.permute_dims(y, [0, 2, 1, 3]),
                             relax.ShapeExpr([b, s, h * hv]))
    outs = [bb.normalize(y), present_k, present_v, bb.normalize(qk_out)]
    n = attr.get("tvm_custom", {}).get("num_outputs", 1)
    return relax.Tuple(outs[:max(n, 1)]) if n > 1 else outs[0]
