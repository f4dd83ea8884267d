"""Dropout at inference: identity, with a boolean all-true mask.

TVM's converter returns relax's dropout, whose mask is float: a silently wrong dtype for graphs
that read the mask. Training-mode dropout is random and refused, unless its ratio is 0.
"""

from __future__ import annotations

from . import register


def _const_scalar(value):
    import tvm

    if value is None:
        return None
    if isinstance(value, tvm.ir.GenericConst):
        return value.value.numpy().reshape(-1)[0].item()
    return "dynamic"


@register("Dropout")
def dropout(bb, inputs, attr, params, opset):
    from tvm import relax

    data = inputs[0]
    ratio = _const_scalar(inputs[1]) if len(inputs) > 1 else attr.get("ratio", 0.5)
    training = _const_scalar(inputs[2]) if len(inputs) > 2 else None
    if training == "dynamic":
        raise ValueError("Dropout with a run-time training_mode input is not supported "
                         "(tvmopt compiles inference graphs)")
    if training and ratio not in (0, 0.0):
        raise ValueError("Dropout in training mode is random and not supported; export the "
                         "model in eval mode")
    attr.get("seed")  # read on purpose: without randomness the seed changes nothing
    n_out = attr.get("tvm_custom", {}).get("num_outputs", 1)
    if n_out == 1:
        return data
    mask = relax.op.ones_like(data, "bool")
    return relax.Tuple([data, bb.normalize(mask)])

