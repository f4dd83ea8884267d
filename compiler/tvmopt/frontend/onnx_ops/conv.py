"""ConvTranspose with `output_shape`: derive pads (and output_padding) as the spec says.

TVM's converter ignores output_shape, giving a differently sized output without an error.
"""

from __future__ import annotations

from . import register, tvm_converter



@register("ConvTranspose")
def conv_transpose(bb, inputs, attr, params, opset):
    from tvm import tirx

    if "output_shape" in attr:
        attr = dict(attr)
        out_shape = list(attr.pop("output_shape"))
        data_shape = inputs[0].ty.shape.values
        spatial = len(data_shape) - 2
        out_shape = out_shape[-spatial:]
        in_sizes = [int(d.value) if isinstance(d, tirx.IntImm) else None
                    for d in data_shape[2:]]
        if None in in_sizes:
            raise ValueError("ConvTranspose output_shape needs static spatial input dims")
        kernel = list(attr.get("kernel_shape") or
                      [int(s) for s in inputs[1].ty.shape.values[2:]])
        strides = list(attr.get("strides", [1] * spatial))
        dil = list(attr.get("dilations", [1] * spatial))
        out_pad = list(attr.get("output_padding", [0] * spatial))
        auto_pad = attr.pop("auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        begin, end = [], []
        for i in range(spatial):
            total = strides[i] * (in_sizes[i] - 1) + out_pad[i] + \
                (kernel[i] - 1) * dil[i] + 1 - out_shape[i]
            if total < 0:  # grow at the end, as output_padding does
                out_pad[i] -= total
                total = 0
            if auto_pad == "SAME_UPPER":
                begin.append(total // 2)
                end.append(total - total // 2)
            else:
                begin.append(total - total // 2)
                end.append(total // 2)
        attr["pads"] = begin + end
        attr["output_padding"] = out_pad
    return tvm_converter("ConvTranspose", opset)(bb, inputs, attr, params)
