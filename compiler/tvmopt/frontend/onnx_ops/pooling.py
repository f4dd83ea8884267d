"""MaxPool's second output, Indices (TVM's converter returned only the values).

The argmax is found the way the reference scans a window: each kernel offset is a strided
slice of the padded input, stacked in row-major window order, and argmax over them keeps the
first of equal maxima. (Padding holds the lowest finite value, so a window of only -inf would
pick padding where the reference picks its first element.) Indices are flat positions in the unpadded
input, row-major (storage_order=0) or with the two spatial dims swapped (storage_order=1).
"""

from __future__ import annotations

import itertools

from . import register, tvm_converter



def _flat_indices(shape, storage_order: int):
    import numpy as np

    if storage_order == 0:
        return np.arange(int(np.prod(shape)), dtype="int64").reshape(shape)
    if len(shape) != 4:
        raise ValueError("MaxPool storage_order=1 is defined for 2-D pooling only")
    n, c, h, w = shape
    hh, ww = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    plane = (np.arange(n * c) * h * w).reshape(n, c, 1, 1)
    return (plane + hh + ww * h).astype("int64")


@register("MaxPool")
class MaxPool:
    @classmethod
    def get_converter(cls, opset):
        base = tvm_converter("MaxPool", opset)

        def convert(bb, inputs, attr, params):
            import numpy as np
            from tvm import relax

            n_out = attr.get("tvm_custom", {}).get("num_outputs", 1)
            values = bb.normalize(base(bb, inputs, attr, params))
            if n_out < 2:
                return values
            x = inputs[0]
            auto_pad = attr.get("auto_pad", b"NOTSET")
            auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
            if auto_pad not in ("NOTSET", "VALID"):
                raise ValueError(f"MaxPool Indices with auto_pad={auto_pad} is not supported; "
                                 "give explicit pads")
            shape = [int(d) for d in x.ty.shape.values]
            out_shape = [int(d) for d in values.ty.shape.values]
            r = len(shape) - 2
            kernel = list(attr["kernel_shape"])
            strides = list(attr.get("strides", [1] * r))
            dil = list(attr.get("dilations", [1] * r))
            pads = list(attr.get("pads", [0] * (2 * r))) if auto_pad == "NOTSET" else [0] * (2 * r)
            width = []
            for i in range(r):  # ceil_mode windows may run past the end padding
                need = (out_shape[2 + i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1
                width.append((pads[i], max(pads[r + i], need - shape[2 + i] - pads[i])))
            dtype = str(x.ty.dtype)
            low = np.finfo(dtype).min if "float" in dtype else np.iinfo(dtype).min
            flat_pad = [0, 0, 0, 0] + [p for pair in width for p in pair]
            xp = bb.normalize(relax.op.nn.pad(x, flat_pad, pad_value=float(low)))
            idx = np.pad(_flat_indices(shape, int(attr.get("storage_order", 0))),
                         [(0, 0), (0, 0)] + width, constant_values=-1)
            idxp = relax.const(idx, "int64")
            axes = list(range(2, 2 + r))
            vs, ids = [], []
            for off in itertools.product(*[range(k) for k in kernel]):
                begin = [o * d for o, d in zip(off, dil)]
                end = [b + (out_shape[2 + i] - 1) * strides[i] + 1 for i, b in enumerate(begin)]
                vs.append(relax.op.strided_slice(xp, axes, begin, end, strides))
                ids.append(relax.op.strided_slice(idxp, axes, begin, end, strides))
            # argmax over the stacked offsets returns the first maximum: the reference's order
            pick = bb.normalize(relax.op.argmax(relax.op.stack(vs, axis=0), axis=0,
                                                keepdims=True))
            best_i = bb.normalize(relax.op.squeeze(relax.op.gather_elements(
                relax.op.stack(ids, axis=0), relax.op.astype(pick, "int64"), axis=0), [0]))
            return relax.Tuple([values, best_i])

        return convert


@register("MaxUnpool")
def max_unpool(bb, inputs, attr, params, opset):
    """MaxUnpool with `output_shape`, constant or fed at run time (TVM's converter reads the
    operand with numpy's `.tolist()`, which neither a Relax constant nor a graph input has).

    As the reference does it: indices are flat positions in the shape the pooling attributes
    infer (the unpadded pool input), so the values scatter into that shape, which then sits at
    the start of each axis of a zero tensor of `output_shape`.
    """
    from tvm import relax, te, tirx
    from tvm.relax.frontend.onnx.onnx_frontend import get_constant

    from .run_time_operands import _static_len, shape_vars
    from .shape_values import static_dims

    shape = inputs[2] if len(inputs) > 2 else None
    if shape is None:
        return tvm_converter("MaxUnpool", opset)(bb, inputs, attr, params)
    data, indices = inputs[0], inputs[1]
    if not isinstance(data.ty.shape, relax.ShapeExpr):
        raise ValueError("MaxUnpool with output_shape needs an input of known rank")
    in_dims = list(data.ty.shape.values)
    kernel = list(attr.get("kernel_shape"))
    n = len(kernel)
    strides = list(attr.get("strides", [1] * n))
    pads = list(attr.get("pads", [0] * 2 * n))
    inferred = in_dims[:2] + [(in_dims[2 + k] - 1) * strides[k] - (pads[k] + pads[n + k])
                              + kernel[k] for k in range(n)]
    shape = get_constant(shape, params)
    out_dims = static_dims(shape)
    if out_dims is None:
        out_dims = shape_vars(bb, shape, _static_len(shape, "output_shape"), "unpool_")
    if len(out_dims) != len(in_dims):
        raise ValueError(f"output_shape has {len(out_dims)} values for an input of rank "
                         f"{len(in_dims)}")
    size = inferred[0]
    for d in inferred[1:]:
        size = size * d
    zeros = bb.emit(relax.op.zeros(relax.ShapeExpr([size]), data.ty.dtype))
    flat = relax.op.scatter_elements(zeros, relax.op.reshape(indices, [-1]),
                                     relax.op.reshape(data, [-1]), axis=0)
    unpooled = bb.emit(relax.op.reshape(flat, relax.ShapeExpr(inferred)))

    def place(y):
        def value(*i):
            inside = tirx.all(*[i[k] < inferred[k] for k in range(len(i))])
            return tirx.if_then_else(inside, y(*i), tirx.const(0, y.dtype))
        return te.compute(out_dims, value, name="max_unpool")

    return bb.emit_te(place, unpooled)
