"""SpaceToDepth with `mode` (CRD, opset 25): TVM's converter ignores the mode (silently wrong)."""

from __future__ import annotations

from . import register


@register("SpaceToDepth")
def space_to_depth(bb, inputs, attr, params, opset):
    from tvm import relax, tirx

    data = inputs[0]
    b = int(attr["blocksize"])
    mode = attr.get("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("DCR", "CRD"):
        raise ValueError(f"SpaceToDepth mode {mode!r} is not DCR or CRD")
    if data.ty.ndim != 4:
        raise ValueError("SpaceToDepth expects a 4-D NCHW input")
    n, c, h, w = data.ty.shape.values
    blk = tirx.IntImm("int64", b)
    x = relax.op.reshape(data, relax.ShapeExpr([n, c, tirx.floordiv(h, b), blk,
                                                tirx.floordiv(w, b), blk]))
    # DCR: out channel = (bh * b + bw) * C + c; CRD: c * b * b + bh * b + bw.
    perm = [0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4]
    x = relax.op.permute_dims(x, perm)
    return relax.op.reshape(x, relax.ShapeExpr([n, c * b * b, tirx.floordiv(h, b),
                                                tirx.floordiv(w, b)]))
