"""Resize (opset 11+) as one constant matrix per resized axis, built from the ONNX reference.

ONNX Resize is separable: every mode (nearest, linear, cubic, with or without antialias,
exclude_outside, every coordinate transformation mode, tf_crop_and_resize extrapolation) maps
each output position along an axis to a fixed weighted sum of input positions along that axis.
With constant scales/sizes and static resized dims, those weights are known at compile time, so
we compute them with the spec's own reference code (`onnx.reference.ops.op_resize`, applied to an
identity matrix) and emit, per axis, a `take` (nearest: exact, any dtype) or a matmul. TVM's
converter mishandles cubic, antialias, half_pixel_symmetric, keep_aspect_ratio_policy, ranks
other than 3-5 and `axes`; this one follows the reference by construction.
"""

from __future__ import annotations

from . import register

_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _constant(value, params, name: str):
    """A constant operand as a numpy array, None when absent or empty; raise when run-time."""
    import tvm
    from tvm.relax.frontend.onnx.onnx_frontend import get_constant

    import numpy as np
    from tvm import relax

    if value is None:
        return None
    value = get_constant(value, params)
    if isinstance(value, tvm.ir.GenericConst):
        arr = value.value.numpy()
        return arr if arr.size else None
    if isinstance(value, relax.ShapeExpr):
        return np.array([int(v) for v in value.values])
    raise ValueError(f"operand '{name}' is computed at run time; tvmopt needs it as a constant "
                     "(an initializer) because it sets the output shape and weights")


def _coeffs_fn(mode: str, antialias: bool, cubic_a: float, nearest_mode: str):
    from onnx.reference.ops import op_resize as ref

    if mode == "nearest":
        if antialias:
            raise ValueError("antialias is not defined for mode 'nearest'")
        return lambda ratio, scale: ref._nearest_coeffs(ratio, mode=nearest_mode)
    if mode == "cubic":
        fn = ref._cubic_coeffs_antialias if antialias else ref._cubic_coeffs
        return lambda ratio, scale: fn(ratio, scale, A=cubic_a)
    if mode == "linear":
        return ref._linear_coeffs_antialias if antialias else ref._linear_coeffs
    raise ValueError(f"unknown mode '{mode}'")


def _plan(shape, scales, sizes, axes, roi, policy):
    """Per-axis scale, output size and roi, as `onnx.reference`'s `_interpolate_nd` sets them."""
    import numpy as np

    r = len(shape)
    axes = list(range(r)) if axes is None else [a + r if a < 0 else a for a in axes]
    full_scales = [1.0] * r
    full_sizes = list(shape)
    full_roi = None
    if scales is not None:
        for i, d in enumerate(axes):
            full_scales[d] = float(scales[i])
        full_sizes = [int(full_scales[i] * shape[i]) for i in range(r)]  # floor, as the spec
    elif sizes is not None:
        for i, d in enumerate(axes):
            full_sizes[d] = int(sizes[i])
        full_scales = [full_sizes[i] / shape[i] for i in range(r)]
        if policy != "stretch":
            pick = np.min if policy == "not_larger" else np.max
            scale = float(pick([full_scales[a] for a in axes]))
            full_scales = [scale if i in axes else 1.0 for i in range(r)]
            full_sizes = [int(scale * shape[i] + 0.5) if i in axes else shape[i] for i in range(r)]
    else:
        raise ValueError("Resize needs scales or sizes")
    if roi is not None:
        full_roi = [0.0] * r + [1.0] * r
        for i, d in enumerate(axes):
            full_roi[d] = float(roi[i])
            full_roi[r + d] = float(roi[len(axes) + i])
    return axes, full_scales, full_sizes, full_roi


def _axis_weights(n, scale, out, coeffs, roi, coord_mode, exclude_outside):
    """(W [out, n] float64, extrapolated mask [out] or None) for one axis."""
    import numpy as np
    from onnx.reference.ops import op_resize as ref

    w = ref._interpolate_1d_along_axis(
        np.eye(n), 0, scale, out, coeffs, roi=roi, extrapolation_value=0.0,
        coordinate_transformation_mode=coord_mode, exclude_outside=exclude_outside)
    mask = None
    if coord_mode == "tf_crop_and_resize" and out:
        _, mask = ref._compute_x_ori(coord_mode, np.arange(out, dtype=np.float64), scale, n,
                                     scale * n, out, roi)
        mask = mask if mask is not None and mask.any() else None
    return w, mask


def _apply_axis(bb, x, axis: int, rank: int, w, mask, extrapolation: float, dtype: str):
    import numpy as np
    from tvm import relax

    onehot = np.all((w == 0) | (w == 1), axis=1) & (w.sum(axis=1) == 1)
    if onehot.all():  # nearest (or an exact copy): gather, exact for every dtype
        idx = relax.const(w.argmax(axis=1).astype("int64"))
        y = bb.normalize(relax.op.take(x, idx, axis=axis))
    else:
        if dtype not in _FLOATS:
            raise ValueError(f"interpolating {dtype} data is not supported; use mode 'nearest'")
        comp = "float32" if dtype in ("float16", "bfloat16") else dtype
        xc = relax.op.astype(x, comp) if comp != dtype else x
        perm = [i for i in range(rank) if i != axis] + [axis]
        if axis != rank - 1:
            xc = relax.op.permute_dims(xc, perm)
        y = relax.op.matmul(xc, relax.const(np.ascontiguousarray(w.T).astype(comp)))
        if axis != rank - 1:
            y = relax.op.permute_dims(y, [perm.index(i) for i in range(rank)])
        if comp != dtype:
            y = relax.op.astype(y, dtype)
        y = bb.normalize(y)
    if mask is not None:
        shape = [1] * rank
        shape[axis] = len(mask)
        m = relax.const(mask.reshape(shape))
        fill = relax.const(np.array(extrapolation, dtype=dtype if dtype != "bfloat16" else "float32"))
        if dtype == "bfloat16":
            fill = relax.op.astype(fill, dtype)
        y = bb.normalize(relax.op.where(m, fill, y))
    return y


@register("Resize")
class Resize:
    """Resize with constant scales/sizes/roi and static resized dims, any mode and rank."""

    @classmethod
    def get_converter(cls, opset):
        if opset < 11:  # Resize-10 takes (X, scales) with other semantics: left to TVM's map
            from tvm.relax.frontend.onnx import onnx_frontend

            return onnx_frontend._get_convert_map()["Resize"].get_converter(opset)
        return cls._convert

    @staticmethod
    def _convert(bb, inputs, attr, params):
        def text(key, default):
            v = attr.get(key, default)
            return v.decode("ascii") if isinstance(v, bytes) else v

        inputs = list(inputs) + [None] * (4 - len(inputs))
        x = inputs[0]
        roi = _constant(inputs[1], params, "roi")
        scales = _constant(inputs[2], params, "scales")
        sizes = _constant(inputs[3], params, "sizes")
        if scales is not None and sizes is not None:
            raise ValueError("both scales and sizes are given; the spec allows only one")
        coord_mode = text("coordinate_transformation_mode", "half_pixel")
        mode = text("mode", "nearest")
        coeffs = _coeffs_fn(mode, bool(attr.get("antialias", 0)),
                            float(attr.get("cubic_coeff_a", -0.75)),
                            text("nearest_mode", "round_prefer_floor"))
        axes_attr = attr.get("axes")
        rank = x.ty.ndim
        dims = [int(d.value) if hasattr(d, "value") else None for d in x.ty.shape]
        # A symbolic dim (batch) may pass through unresized: plan it as 1, then check it stayed.
        axes, f_scales, f_sizes, f_roi = _plan(
            [1 if d is None else d for d in dims], scales, sizes,
            list(axes_attr) if axes_attr is not None else None, roi,
            text("keep_aspect_ratio_policy", "stretch"))
        for a in axes:
            if dims[a] is None and (sizes is not None or f_scales[a] != 1.0):
                raise ValueError(f"dimension {a} ({x.ty.shape[a]}) is symbolic but resized; "
                                 "Resize needs resized dims static")
        dtype = str(x.ty.dtype)
        extrapolation = float(attr.get("extrapolation_value", 0.0))
        y = x
        for a in axes:
            if dims[a] is None:
                continue
            n, out = dims[a], f_sizes[a]
            a_roi = None if f_roi is None else [f_roi[a], f_roi[a + rank]]
            if out == n and abs(f_scales[a] - 1.0) < 1e-12 and (
                    a_roi is None or (a_roi[0] == 0.0 and a_roi[1] == 1.0)):
                continue  # identity along this axis, as the reference skips it
            w, mask = _axis_weights(n, f_scales[a], out, coeffs, a_roi, coord_mode,
                                    bool(attr.get("exclude_outside", 0)))
            y = _apply_axis(bb, y, a, rank, w, mask, extrapolation, dtype)
        return y

