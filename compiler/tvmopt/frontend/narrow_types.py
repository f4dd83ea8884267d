"""8-, 4- and 2-bit ONNX types, and the byte carriers that hold them inside tvmopt.

TVM 0.27 cannot take sub-byte tensors in or out ("TensorCopyFromBytes: size mismatch",
"dtype.bits % 8 == 0"), and its own float8/float4 conversions do not round or saturate as ONNX
says. So inside tvmopt every tensor of a narrow ONNX type is carried in bytes:

- int4/int2 in an int8 tensor and uint4/uint2 in a uint8 tensor, holding the value;
- float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz, e8m0), float4e2m1 and float6 in a uint8 tensor,
  holding the bit code (ml_dtypes' one-byte layout).

The conversions to and from those carriers are tvmopt converters (`onnx_ops/narrow.py`). This
module is the boundary: the artifact's signature keeps the ONNX dtype names (`int4`,
`float8_e4m3fn`), and `to_carrier` / `from_carrier` turn the ml_dtypes arrays a user passes
(`onnx.numpy_helper.to_array` gives them) into what the compiled function takes, and back.
No TVM import here: `runtime` and `inspect` use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class NarrowType:
    """One narrow ONNX element type."""

    name: str  # the numpy / ml_dtypes name, as in manifests: 'int4', 'float8_e4m3fn'
    onnx: int  # TensorProto.DataType
    carrier: str  # 'int8' or 'uint8'
    is_float: bool  # True: the carrier holds the bit code; False: it holds the value
    bits: int

    @property
    def carrier_onnx(self) -> int:
        return 3 if self.carrier == "int8" else 2  # TensorProto.INT8 / UINT8

    @property
    def np_dtype(self) -> np.dtype:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, self.name))

    @property
    def int_range(self) -> tuple[int, int]:
        if self.is_float:
            raise ValueError(f"{self.name} is not an integer type")
        if self.carrier == "int8":
            return -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        return 0, (1 << self.bits) - 1


# (ONNX name, ml_dtypes name, carrier, float?, bits); codes from onnx.TensorProto.DataType.
_TYPES = [
    (17, "float8_e4m3fn", "uint8", True, 8),
    (18, "float8_e4m3fnuz", "uint8", True, 8),
    (19, "float8_e5m2", "uint8", True, 8),
    (20, "float8_e5m2fnuz", "uint8", True, 8),
    (21, "uint4", "uint8", False, 4),
    (22, "int4", "int8", False, 4),
    (23, "float4_e2m1fn", "uint8", True, 4),
    (24, "float8_e8m0fnu", "uint8", True, 8),
    (25, "uint2", "uint8", False, 2),
    (26, "int2", "int8", False, 2),
    (27, "float6_e2m3fn", "uint8", True, 6),
    (28, "float6_e3m2fn", "uint8", True, 6),
]


@lru_cache(maxsize=None)
def _by_name() -> dict[str, NarrowType]:
    return {name: NarrowType(name, code, carrier, is_float, bits)
            for code, name, carrier, is_float, bits in _TYPES}


@lru_cache(maxsize=None)
def _by_onnx() -> dict[int, NarrowType]:
    return {t.onnx: t for t in _by_name().values()}


def by_name(dtype) -> NarrowType | None:
    """The narrow type of a dtype name (or numpy dtype), None for ordinary types."""
    return _by_name().get(str(dtype))


def by_onnx(elem_type: int) -> NarrowType | None:
    """The narrow type of an ONNX TensorProto elem type, None for ordinary types."""
    return _by_onnx().get(int(elem_type))


def carrier_name(dtype: str) -> str:
    """The dtype tvmopt's compiled function uses for a signature dtype."""
    t = by_name(dtype)
    return t.carrier if t else dtype


def np_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a signature dtype name ('int4' is ml_dtypes' int4, not numpy's int32)."""
    t = by_name(dtype)
    return t.np_dtype if t else np.dtype(bool if dtype == "bool" else dtype)


def contiguous(arr) -> np.ndarray:
    """A C-contiguous array of the same shape (np.ascontiguousarray makes 0-d arrays 1-d)."""
    arr = np.asarray(arr)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def to_carrier(arr: np.ndarray) -> np.ndarray:
    """An ml_dtypes array of a narrow type as its (C-contiguous) carrier; others unchanged."""
    t = by_name(arr.dtype)
    if t is None:
        return arr
    arr = contiguous(arr)
    return arr.view(np.uint8) if t.is_float else arr.astype(t.carrier)


def from_carrier(arr: np.ndarray, dtype: str) -> np.ndarray:
    """A carrier array back as the narrow type `dtype`; other dtypes unchanged."""
    t = by_name(dtype)
    if t is None:
        return arr
    arr = contiguous(arr)
    return arr.view(t.np_dtype) if t.is_float else arr.astype(t.np_dtype)


def float_to_int(x: np.ndarray, dtype: str) -> np.ndarray:
    """tvmopt's float -> int4/uint4/int2/uint2 cast, as an ml_dtypes array of `dtype`.

    ONNX's Cast leaves a float outside the integer type's range undefined, and ml_dtypes has
    changed its answer between releases (0.5 wrapped, 0.7 gives 0), so tvmopt fixes one rule:
    truncate toward zero, then keep the low bits (two's complement), which is the spec's own
    rule for fixed -> fixed casts and what onnxruntime gives for integral values. NaN and
    +-Inf give 0. The compiled cast (`onnx_ops.narrow.wrap_int`) implements this rule.
    """
    t = by_name(dtype)
    if t is None or t.is_float:
        raise ValueError(f"{dtype} is not a narrow integer type")
    x = np.asarray(x, np.float64)
    v = np.where(np.isfinite(x), np.trunc(np.nan_to_num(x, posinf=0.0, neginf=0.0)), 0.0)
    v = v.astype(np.int64) & ((1 << t.bits) - 1)
    if t.carrier == "int8":
        sign = 1 << (t.bits - 1)
        v = (v ^ sign) - sign
    return v.astype(t.carrier).astype(t.np_dtype)


def float_to_int_unspecified(x: np.ndarray, dtype: str) -> np.ndarray:
    """Where ONNX leaves a float -> narrow-int cast undefined: NaN, Inf or out of range."""
    lo, hi = by_name(dtype).int_range
    x = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(x) | (np.trunc(x) < lo) | (np.trunc(x) > hi)


def from_npz(arr: np.ndarray, dtype: str) -> np.ndarray:
    """np.savez stores ml_dtypes arrays as raw bytes ('V1'): read them back as `dtype`."""
    t = by_name(dtype)
    if t is not None and arr.dtype.kind == "V" and arr.dtype.itemsize == 1:
        return arr.view(t.np_dtype)
    return arr


def like_narrow(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """onnxruntime's output of a narrow type (raw uint8 codes / int8 values) as got's dtype."""
    t = by_name(got.dtype)
    ref = np.asarray(ref)
    if t is None or ref.dtype == got.dtype or ref.shape != got.shape or ref.dtype.itemsize != 1:
        return ref
    return contiguous(ref).view(t.np_dtype) if t.is_float else ref.astype(t.np_dtype)
