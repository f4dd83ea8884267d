"""NonMaxSuppression: refuse run-time limits instead of silently ignoring them.

TVM's converter reads max_output_boxes_per_class / iou_threshold / score_threshold only when
they are constants and otherwise substitutes defaults (max 0 boxes: an empty result).
"""

from __future__ import annotations

from . import register, tvm_converter



@register("NonMaxSuppression")
def non_max_suppression(bb, inputs, attr, params, opset):
    import tvm
    from tvm import relax

    names = ["max_output_boxes_per_class", "iou_threshold", "score_threshold"]
    for name, value in zip(names, list(inputs)[2:5]):
        if value is None or isinstance(value, tvm.ir.GenericConst):
            continue
        if isinstance(value, relax.Var) and value.name in params[1]:
            continue
        raise ValueError(f"NonMaxSuppression needs a constant {name}; it is computed "
                         "at run time here")
    return tvm_converter("NonMaxSuppression", opset)(bb, inputs, attr, params)
