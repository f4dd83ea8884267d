"""OptionalHasElement with its input omitted.

ONNX lets the optional input be left out altogether (an empty Optional): the answer is then a
constant false. TVM's converter insists on exactly one input.
"""

from __future__ import annotations

from . import register, tvm_converter


@register("OptionalHasElement")
def optional_has_element(bb, inputs, attr, params, opset):
    from tvm import relax

    if len(inputs) == 0 or inputs[0] is None:
        return relax.const(False, "bool")
    return tvm_converter("OptionalHasElement", opset)(bb, inputs, attr, params)
