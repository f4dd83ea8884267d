"""Cast / CastLike, with exact 8/4/2-bit conversions.

TVM 0.27's own casts to float8 e4m3fn/e5m2 do not saturate as ONNX specifies (and ignore
`saturate`), the FNUZ variants come out as different values altogether, float8 -> float
differs on some values, float4 does not build, and sub-byte integers cannot cross the VM
boundary. So a cast touching a narrow type is built by tvmopt (`narrow.py`: byte carriers,
table decode, threshold encode, as onnx.reference computes it); every other cast is TVM's.
"""

from __future__ import annotations

from . import register, tvm_converter



def _dtype_name(value) -> str | None:
    ty = getattr(value, "ty", None)
    dt = getattr(ty, "dtype", None)
    return str(dt) if dt is not None else None


def _check(src: str | None, dst: str | None) -> None:
    """Refuse what TVM would get wrong when the types were not annotated by carry_in_bytes."""
    from ..narrow_types import by_name

    def low_float(name):
        t = by_name(name)
        return t is not None and t.is_float

    if low_float(src) or low_float(dst):
        raise ValueError(f"Cast from {src} to {dst} is not supported here: TVM 0.27's 8/4-bit "
                         "float conversions do not follow ONNX rounding/saturation")


def _attr_str(attr, name, default):
    v = attr.get(name, default)
    return v.decode() if isinstance(v, bytes) else str(v)


def narrow_cast(bb, x, src: int, dst: int, saturate: bool = True, round_mode: str = "up"):
    """Cast between ONNX element types when either is narrow; None when neither is.

    `x` is the carrier of `src` when src is narrow; the result is the carrier of `dst` when dst
    is narrow.
    """
    from tvm import relax

    from ..narrow_types import by_onnx
    from .narrow import decode, encode_float, onnx_dtype_name, wrap_int

    s, d = by_onnx(src), by_onnx(dst)
    if s is None and d is None:
        return None
    if s is not None and s == d:
        return x
    if d is None:
        dst_name = onnx_dtype_name(dst)
        if dst_name is None:
            raise ValueError(f"Cast from {s.name} to ONNX type {dst} is not supported")
        if s.is_float:  # exact in float32, then one rounding to the target as ml_dtypes does
            return relax.op.astype(decode(bb, x, s, "float32"), dst_name)
        return relax.op.astype(x, dst_name)
    value = decode(bb, x, s, "float32") if s is not None and s.is_float else x
    if d.is_float:
        return encode_float(bb, value, d, saturate, round_mode)
    return wrap_int(bb, value, d)


@register("Cast")
def cast(bb, inputs, attr, params, opset):
    from onnx import helper

    from .narrow import onnx_types

    types = onnx_types(attr, inputs, "Cast")
    if types is not None:
        out = narrow_cast(bb, inputs[0], types[0][0], attr["to"],
                          bool(attr.get("saturate", 1)),
                          _attr_str(attr, "round_mode", "up"))
        if out is not None:
            return out
    try:
        dst = str(helper.tensor_dtype_to_np_dtype(attr["to"]))
    except (KeyError, TypeError):  # no `to`, or a code onnx has no numpy type for
        dst = None  # TVM's converter reports it
    _check(_dtype_name(inputs[0]), dst)
    return tvm_converter("Cast", opset)(bb, inputs, attr, params)


@register("CastLike")
def cast_like(bb, inputs, attr, params, opset):
    from .narrow import onnx_types

    types = onnx_types(attr, inputs, "CastLike")
    if types is not None:
        out = narrow_cast(bb, inputs[0], types[0][0], types[0][1],
                          bool(attr.get("saturate", 1)),
                          _attr_str(attr, "round_mode", "up"))
        if out is not None:
            return out
    _check(_dtype_name(inputs[0]), _dtype_name(inputs[1]))
    return tvm_converter("CastLike", opset)(bb, inputs, attr, params)
