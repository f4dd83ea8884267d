"""Tensors generated from another tensor's shape: EyeLike."""

from __future__ import annotations

from . import register


@register("EyeLike")
def eye_like(bb, inputs, attr, params, opset):
    """The `dtype` attribute sets the output type (TVM's refused any dtype but the input's)."""
    from onnx import helper
    from tvm import relax

    x = inputs[0]
    dtype = str(x.ty.dtype)
    if "dtype" in attr:
        dtype = str(helper.tensor_dtype_to_np_dtype(attr["dtype"]))
    if x.ty.ndim != 2:
        raise ValueError(f"EyeLike takes a 2-D input, got rank {x.ty.ndim}")
    n, m = x.ty.shape.values
    return relax.op.eye(n, m, int(attr.get("k", 0)), dtype)
