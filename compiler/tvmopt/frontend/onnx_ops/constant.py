"""Constant in all its attribute forms (TVM's converter reads only `value`)."""

from __future__ import annotations

from . import register


@register("Constant")
def constant(bb, inputs, attr, params, opset):
    """value / value_float(s) / value_int(s) / sparse_value; strings are refused by name."""
    import numpy as np
    from onnx import numpy_helper
    from tvm import relax

    if "value" in attr:
        arr = numpy_helper.to_array(attr["value"])
    elif "sparse_value" in attr:
        sp = attr["sparse_value"]
        values = numpy_helper.to_array(sp.values)
        idx = numpy_helper.to_array(sp.indices)
        arr = np.zeros(tuple(sp.dims), values.dtype)
        if idx.ndim == 1:  # linearised indices
            arr.reshape(-1)[idx] = values
        else:
            arr[tuple(idx.T)] = values
    elif "value_float" in attr:
        arr = np.array(attr["value_float"], np.float32)
    elif "value_floats" in attr:
        arr = np.array(attr["value_floats"], np.float32)
    elif "value_int" in attr:
        arr = np.array(attr["value_int"], np.int64)
    elif "value_ints" in attr:
        arr = np.array(attr["value_ints"], np.int64)
    else:
        given = sorted(k for k in attr if k != "tvm_custom")
        raise ValueError(f"Constant with {given or 'no value'}: string constants are not "
                         "supported by tvmopt")
    if arr.dtype.kind in "OUS":
        raise ValueError("string-valued Constant is not supported by tvmopt")
    return relax.const(arr, str(arr.dtype))
