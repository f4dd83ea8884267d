"""BatchNormalization in training mode (opset 14+ `training_mode=1`), and RoiAlign max refused.

TVM's BatchNormalization converter ignores `training_mode` and normalizes with the running
statistics it was given, so a training-mode node (graphs exported with `model.train()`, the
ONNX node tests) came out silently wrong. Here the batch statistics are computed as
onnx.reference does: population mean/variance over every axis but 1, outputs Y, running_mean,
running_var (momentum-blended).
"""

from __future__ import annotations

from . import register, tvm_converter



@register("BatchNormalization")
def batch_normalization(bb, inputs, attr, params, opset):
    if opset < 14 or not attr.get("training_mode", 0):
        return tvm_converter("BatchNormalization", opset)(bb, inputs, attr, params)
    return _training(bb, inputs, attr)


def _training(bb, inputs, attr):
    from tvm import relax

    x, scale, bias, mean, var = inputs[:5]
    rank = x.ty.ndim
    if rank is None or rank < 2:
        raise ValueError("BatchNormalization in training mode needs an input of known rank >= 2")
    eps = float(attr.get("epsilon", 1e-5))
    momentum = float(attr.get("momentum", 0.9))
    dtype = str(x.ty.dtype)
    axes = [a for a in range(rank) if a != 1]
    op = relax.op

    def const(v):
        return relax.const(v, dtype)

    def per_channel(v):
        return op.reshape(v, [-1] + [1] * (rank - 2))

    batch_mean = bb.emit(op.mean(x, axis=axes))
    centered = bb.emit(op.subtract(x, per_channel(batch_mean)))
    batch_var = bb.emit(op.mean(op.multiply(centered, centered), axis=axes))
    y = op.add(op.multiply(per_channel(scale),
                           op.divide(centered, op.sqrt(op.add(per_channel(batch_var),
                                                              const(eps))))),
               per_channel(bias))
    run_mean = op.add(op.multiply(mean, const(momentum)),
                      op.multiply(batch_mean, const(1.0 - momentum)))
    run_var = op.add(op.multiply(var, const(momentum)),
                     op.multiply(batch_var, const(1.0 - momentum)))
    return relax.Tuple([bb.emit(y), bb.emit(run_mean), bb.emit(run_var)])


@register("RoiAlign")
def roi_align(bb, inputs, attr, params, opset):
    mode = attr.get("mode", b"avg")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode != "avg":
        # TVM's max mode takes the max of the sampled points; ONNX (and onnxruntime)
        # take the max of the bilinear-weighted corner values: different numbers.
        raise ValueError(f"RoiAlign mode '{mode}' is not supported (only 'avg'): TVM's "
                         "max pooling differs from ONNX's definition")
    return tvm_converter("RoiAlign", opset)(bb, inputs, attr, params)
