"""BitCast (opset 26): reinterpret the bits of a tensor as another type of the same width.

TVM 0.27's Relax has no bitcast op; TOPI's `reinterpret` (TIR's reinterpret intrinsic) does it
element-wise, emitted as a TE function. bool has no bit pattern in TVM's IR (it is i1), so a bool
source or target goes through a value cast, which for 0/1 is the same byte.
"""

from __future__ import annotations

from . import register


@register("BitCast")
def bit_cast(bb, inputs, attr, params, opset):
    from onnx import helper
    from tvm import relax, topi

    dst = str(helper.tensor_dtype_to_np_dtype(attr["to"]))
    x = bb.normalize(inputs[0])
    src = str(x.ty.dtype)
    bits = {"bool": 8, "int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "float16": 16,
            "bfloat16": 16, "int32": 32, "uint32": 32, "float32": 32, "int64": 64,
            "uint64": 64, "float64": 64}
    if src not in bits or dst not in bits:
        raise ValueError(f"BitCast from {src} to {dst} is not supported")
    if bits[src] != bits[dst]:
        raise ValueError(f"BitCast from {src} to {dst}: the widths differ")
    if src == dst:
        return x
    if "bool" in (src, dst):
        return relax.op.astype(x, dst)
    return bb.emit_te(topi.reinterpret, x, dst)
