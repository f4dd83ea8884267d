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

from . import register, tvm_converter

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
        if not all(hasattr(v, "value") for v in value.values):
            raise ValueError(f"operand '{name}' ({list(value.values)}) depends on symbolic dims "
                             "other than the resized input's own; pass --shape to fix them")
        return np.array([int(v.value) for v in value.values])
    raise ValueError(f"operand '{name}' is computed at run time; tvmopt needs it as a constant "
                     "(an initializer) because it sets the output shape and weights")


def _sizes_keeping_symbolic(value, x, axes_attr):
    """`sizes` as exporters write it for a dynamic batch, Concat(Shape(x)[:2], [h, w]): a shape
    whose symbolic entries are x's own dims there. Returns (sizes with 1 for those entries,
    the axes they keep), or (None, set()) when `value` is not such a shape."""
    import numpy as np
    from tvm import relax, tirx

    if not isinstance(value, relax.ShapeExpr):
        return None, set()
    rank = x.ty.ndim
    axes = list(range(rank)) if axes_attr is None else [a + rank if a < 0 else a
                                                         for a in axes_attr]
    out, kept = [], set()
    for a, v in zip(axes, value.values):
        if isinstance(v, tirx.IntImm):
            out.append(int(v.value))
        elif v.same_as(x.ty.shape[a]):
            out.append(1)
            kept.add(a)
        else:
            return None, set()
    return (np.array(out, dtype="int64"), kept) if kept else (None, set())


def _constant_tensor(value, params, name: str):
    """A constant operand as a Relax constant; None when absent or empty."""
    from tvm import relax

    arr = _constant(value, params, name)
    return None if arr is None else relax.const(arr)


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
            return tvm_converter("Resize", opset)
        return cls._convert

    @staticmethod
    def _convert(bb, inputs, attr, params):
        def text(key, default):
            v = attr.get(key, default)
            return v.decode("ascii") if isinstance(v, bytes) else v

        inputs = list(inputs) + [None] * (4 - len(inputs))
        x = inputs[0]
        from .run_time_operands import is_run_time

        symbolic = _symbolic_resize(bb, x, inputs, attr, params, text)
        if symbolic is not None:
            return symbolic

        if any(is_run_time(v, params) for v in inputs[1:4]):
            def operand(v, name):
                return v if is_run_time(v, params) else _constant_tensor(v, params, name)

            scales_in = operand(inputs[2], "scales")
            sizes_in = operand(inputs[3], "sizes")
            if scales_in is not None and sizes_in is not None:
                raise ValueError("both scales and sizes are given; the spec allows only one")
            return _run_time_resize(bb, x, operand(inputs[1], "roi"), scales_in, sizes_in,
                                    attr, text)
        roi = _constant(inputs[1], params, "roi")
        scales = _constant(inputs[2], params, "scales")
        sizes, kept = _sizes_keeping_symbolic(inputs[3], x, attr.get("axes"))
        if sizes is None:
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
            if dims[a] is None and a not in kept and (sizes is not None or f_scales[a] != 1.0):
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



# ---------------------------------------------------------------------------------------------
# symbolic image sizes: TVM's resize2d, which interpolates from the sizes when the artifact runs

_TOPI_COORD_MODES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel",
                     "tf_half_pixel_for_nn")


def _symbolic_resize(bb, x, inputs, attr, params, text):
    """Resize of an NCHW image whose H/W are symbolic, or whose target size is (a fully
    convolutional net resized to any input, DeepLab's logits resized to the input's size):
    `relax.op.image.resize2d`, whose kernel computes the interpolation from the sizes at run
    time. None when the per-axis weight matrices above apply (every resized size static) or
    the node asks for what resize2d does not compute as ONNX defines it (antialias, a kept
    aspect ratio, axes, a non-integer scale of a symbolic dim, whose output size ONNX rounds
    while resize2d would use the rounded ratio).

    Raises:
        ValueError: `sizes` given at run time whose batch/channel entries are not x's own.
    """
    import numpy as np
    from tvm import relax, tirx

    from .run_time_operands import is_run_time, shape_vars

    if x.ty.ndim != 4 or not isinstance(x.ty.shape, relax.ShapeExpr):
        return None
    shape = list(x.ty.shape.values)
    roi, scales_in, sizes_in = inputs[1:4]
    if attr.get("antialias", 0) or attr.get("axes") is not None \
            or text("keep_aspect_ratio_policy", "stretch") != "stretch":
        return None
    coord = text("coordinate_transformation_mode", "half_pixel")
    mode = text("mode", "nearest")
    nearest_mode = text("nearest_mode", "round_prefer_floor")  # read: only nearest uses it
    if coord not in _TOPI_COORD_MODES or mode not in ("nearest", "linear", "cubic"):
        return None
    if roi is not None and is_run_time(roi, params):
        return None
    static_hw = all(isinstance(d, tirx.IntImm) for d in shape[2:])
    if sizes_in is not None and is_run_time(sizes_in, params):
        if static_hw and not any(not isinstance(d, tirx.IntImm) for d in shape[:2]):
            return None  # a static image at run-time sizes: the run-time weights path
        length = getattr(sizes_in.ty, "shape", None)
        if length is None or len(length) != 1 or not isinstance(length[0], tirx.IntImm) \
                or int(length[0]) != 4:
            return None
        from .. import run_time_checks

        sizes_in = run_time_checks.checked_sizes(bb, sizes_in, run_time_checks.site(3, "sizes"))
        # The batch and channel entries must be x's own: the match_cast checks it at run time.
        out_hw = [tirx.Var(f"resize_h{id(sizes_in) % 10007}", "int64"),
                  tirx.Var(f"resize_w{id(sizes_in) % 10007}", "int64")]
        value = bb.emit(relax.op.tensor_to_shape(sizes_in))
        bb.match_cast(value, relax.ShapeType([shape[0], shape[1], *out_hw]))
        size = out_hw
    elif isinstance(sizes_in, relax.ShapeExpr):
        vals = list(sizes_in.values)
        if len(vals) != 4 or not all(_same_dim(a, b) for a, b in zip(vals[:2], shape[:2])):
            return None
        if static_hw and all(isinstance(v, tirx.IntImm) for v in vals[2:]):
            return None
        size = vals[2:]
    else:
        if static_hw or scales_in is None or is_run_time(scales_in, params):
            return None
        scales = _constant(scales_in, params, "scales")
        if scales is None or len(scales) != 4 or list(scales[:2]) != [1.0, 1.0]:
            return None
        if any(v < 1 or v != np.floor(v) for v in scales[2:]):
            return None
        size = [d * int(v) for d, v in zip(shape[2:], scales[2:])]
    roi_static = [0.0] * 4
    if roi is not None:
        arr = _constant(roi, params, "roi")
        if arr is not None and len(arr) == 8:
            roi_static = [float(v) for v in (arr[2], arr[3], arr[6], arr[7])]
    return relax.op.image.resize2d(
        x, size=relax.ShapeExpr(size), roi=roi_static, layout="NCHW",
        method="nearest_neighbor" if mode == "nearest" else mode,
        coordinate_transformation_mode=coord,
        rounding_method=nearest_mode if mode == "nearest" else "",
        cubic_alpha=float(attr.get("cubic_coeff_a", -0.75)),
        cubic_exclude=int(attr.get("exclude_outside", 0)),
        extrapolation_value=float(attr.get("extrapolation_value", 0.0)))


def _same_dim(a, b) -> bool:
    from tvm import tirx

    if isinstance(a, tirx.IntImm) and isinstance(b, tirx.IntImm):
        return int(a) == int(b)
    return a.same_as(b)


# ---------------------------------------------------------------------------------------------
# scales/sizes/roi given at run time: the same per-axis weights, computed by the artifact


def _keys(d, a: float):
    """The cubic convolution kernel at |d| (the polynomials of the reference's cubic coeffs)."""
    from tvm import relax

    def c(v):
        return relax.const(v, "float64")

    x = relax.op.abs(d)
    x2 = relax.op.multiply(x, x)
    x3 = relax.op.multiply(x2, x)
    near = relax.op.add(relax.op.subtract(relax.op.multiply(c(a + 2), x3),
                                          relax.op.multiply(c(a + 3), x2)), c(1.0))
    far = relax.op.add(relax.op.subtract(relax.op.multiply(c(a), x3),
                                         relax.op.multiply(c(5 * a), x2)),
                       relax.op.subtract(relax.op.multiply(c(8 * a), x), c(4 * a)))
    return relax.op.where(relax.op.less_equal(x, c(1.0)), near,
                          relax.op.where(relax.op.less(x, c(2.0)), far, c(0.0)))


def _x_original(o, s, n: int, out, coord_mode: str, roi):
    """Source coordinate of each output position o (float64), as `_compute_x_ori`; also the
    tf_crop_and_resize extrapolation mask (else None)."""
    from tvm import relax

    def c(v):
        return relax.const(float(v), "float64")

    width = relax.op.multiply(s, c(n))  # scale * input width: fractional, as the spec's
    one_wide = relax.op.equal(width, c(1.0))
    half = relax.op.subtract(relax.op.divide(relax.op.add(o, c(0.5)), s), c(0.5))
    mask = None
    if coord_mode == "align_corners":
        x = relax.op.where(one_wide, c(0.0), relax.op.divide(relax.op.multiply(o, c(n - 1)),
                                                             relax.op.subtract(width, c(1.0))))
    elif coord_mode == "asymmetric":
        x = relax.op.divide(o, s)
    elif coord_mode == "tf_crop_and_resize":
        r0, r1 = roi
        span = relax.op.multiply(relax.op.subtract(r1, r0), c(n - 1))
        x = relax.op.where(one_wide, relax.op.divide(span, c(2.0)),
                           relax.op.divide(relax.op.multiply(o, span),
                                           relax.op.subtract(width, c(1.0))))
        x = relax.op.add(x, relax.op.multiply(r0, c(n - 1)))
        mask = relax.op.logical_or(relax.op.less(x, c(0.0)), relax.op.greater(x, c(n - 1)))
    elif coord_mode == "pytorch_half_pixel":
        x = relax.op.where(one_wide, c(-0.5), half)
    elif coord_mode == "half_pixel":
        x = half
    elif coord_mode == "half_pixel_symmetric":
        offset = relax.op.multiply(c(n / 2), relax.op.subtract(c(1.0), relax.op.divide(out, width)))
        x = relax.op.add(offset, half)
    else:
        raise ValueError(f"unknown coordinate_transformation_mode '{coord_mode}'")
    return x, mask


def _run_time_weights(bb, x_ori, s, n: int, mode: str, antialias: bool, cubic_a: float,
                      exclude_outside: bool):
    """(out, n) float64 weights: the reference's taps, edge-clamped, as one dense matrix.

    The taps of output o are the K integers p nearest x = x_ori[o] (ties to the smaller):
    ceil(x) - K/2 .. ceil(x) + K/2 - 1, each weighted kernel((p - x) * scale) (antialias:
    normalised over the taps); p outside [0, n) reads the edge (or is dropped with
    exclude_outside). K is 2 (linear) or 4 (cubic); with antialias it grows with 1/scale, and
    since any scale giving a non-empty output is >= 0.5/n, p stays within [-4n, 5n).
    """
    import numpy as np
    from tvm import relax

    def c(v):
        return relax.const(float(v), "float64")

    reach = (4 * n if mode == "cubic" else 2 * n) if antialias else (2 if mode == "cubic" else 1)
    p_np = np.arange(-reach, n + reach, dtype="float64")
    p = relax.const(p_np[None, :], "float64")
    x = relax.op.expand_dims(x_ori, 1)  # (out, 1)
    if antialias:
        se = relax.op.minimum(s, c(1.0))
        support = 2.0 if mode == "cubic" else 1.0
        start = relax.op.add(relax.op.floor(relax.op.divide(c(-support), se)), c(1.0))
        half_k = relax.op.subtract(c(1.0), start)  # K/2 = (2 - 2*start)/2
    else:
        se = c(1.0)
        half_k = c(2.0 if mode == "cubic" else 1.0)
    lo = relax.op.subtract(relax.op.ceil(x), half_k)
    hi = relax.op.subtract(relax.op.add(relax.op.ceil(x), half_k), c(1.0))
    taps = relax.op.logical_and(relax.op.greater_equal(p, lo), relax.op.less_equal(p, hi))
    d = relax.op.multiply(relax.op.subtract(p, x), se)
    if mode == "cubic":
        w = _keys(d, cubic_a)
    else:
        w = relax.op.clip(relax.op.subtract(c(1.0), relax.op.abs(d)), 0.0, 1.0)
    w = bb.normalize(relax.op.where(taps, w, c(0.0)))
    if antialias:
        w = bb.normalize(relax.op.divide(w, relax.op.sum(w, axis=[1], keepdims=True)))
    if exclude_outside:
        inside = relax.const(((p_np >= 0) & (p_np < n))[None, :])
        w = bb.normalize(relax.op.where(inside, w, c(0.0)))
        total = relax.op.sum(w, axis=[1], keepdims=True)
        w = bb.normalize(relax.op.divide(w, relax.op.where(relax.op.equal(total, c(0.0)),
                                                           c(1.0), total)))
    clamp = (np.clip(p_np, 0, n - 1)[:, None] == np.arange(n)[None, :]).astype("float64")
    return bb.normalize(relax.op.matmul(w, relax.const(clamp, "float64")))


def _nearest_index(x_ori, n: int, nearest_mode: str):
    from tvm import relax

    def c(v):
        return relax.const(float(v), "float64")

    fl = relax.op.floor(x_ori)
    r = relax.op.subtract(x_ori, fl)
    up = relax.op.add(fl, c(1.0))
    if nearest_mode == "round_prefer_floor":
        idx = relax.op.where(relax.op.less_equal(r, c(0.5)), fl, up)
    elif nearest_mode == "round_prefer_ceil":
        idx = relax.op.where(relax.op.less(r, c(0.5)), fl, up)
    elif nearest_mode == "floor":
        idx = fl
    elif nearest_mode == "ceil":
        idx = up
    else:
        raise ValueError(f"unknown nearest_mode '{nearest_mode}'")
    idx = relax.op.where(relax.op.equal(r, c(0.0)), x_ori, idx)  # on a pixel: that pixel
    return relax.op.astype(relax.op.clip(idx, 0.0, float(n - 1)), "int64")


def _run_time_resize(bb, x, roi, scales, sizes, attr, text):
    """Resize whose scales, sizes or roi are inputs: output dims become symbolic vars bound
    when the artifact runs, and each axis's weights are computed from the operand's values."""
    import numpy as np
    from tvm import relax

    from .run_time_operands import _static_len, shape_vars

    def c(v):
        return relax.const(float(v), "float64")

    rank = x.ty.ndim
    dims = [int(d.value) if hasattr(d, "value") else None for d in x.ty.shape]
    axes_attr = attr.get("axes")
    axes = list(range(rank)) if axes_attr is None else [a + rank if a < 0 else a
                                                         for a in axes_attr]
    for a in axes:
        if dims[a] is None:
            raise ValueError(f"dimension {a} ({x.ty.shape[a]}) is symbolic and resized by "
                             "operands given at run time; Resize needs its dims static")
    mode = text("mode", "nearest")
    coord_mode = text("coordinate_transformation_mode", "half_pixel")
    operand = scales if scales is not None else sizes
    if _static_len(operand, "scales" if scales is not None else "sizes") != len(axes):
        raise ValueError(f"Resize: {len(axes)} axes but a {operand.ty.shape[0]}-long operand")
    dtype = str(x.ty.dtype)
    if mode != "nearest" and dtype not in _FLOATS:
        raise ValueError(f"interpolating {dtype} data is not supported; use mode 'nearest'")

    def pick(t, k):
        return relax.op.astype(relax.op.take(t, relax.const(k, "int64"), axis=0), "float64")

    if scales is not None:
        s = [bb.normalize(pick(scales, k)) for k in range(len(axes))]
        outs = [relax.op.floor(relax.op.multiply(s[k], c(dims[a]))) for k, a in enumerate(axes)]
    else:
        ratio = [relax.op.divide(pick(sizes, k), c(dims[a])) for k, a in enumerate(axes)]
        policy = text("keep_aspect_ratio_policy", "stretch")
        if policy == "stretch":
            s, outs = ratio, [pick(sizes, k) for k in range(len(axes))]
        else:
            both = relax.op.stack(ratio, axis=0)
            one = relax.op.min(both) if policy == "not_larger" else relax.op.max(both)
            one = bb.normalize(one)
            s = [one] * len(axes)
            outs = [relax.op.floor(relax.op.add(relax.op.multiply(one, c(dims[a])), c(0.5)))
                    for a in axes]
        s = [bb.normalize(v) for v in s]
    out_vec = bb.normalize(relax.op.astype(relax.op.stack(
        [relax.op.reshape(o, [1]) for o in outs], axis=0), "int64"))
    out_vec = bb.normalize(relax.op.reshape(out_vec, [len(axes)]))
    out_dims = shape_vars(bb, out_vec, len(axes), "resize_d")
    roi_pairs = None
    if coord_mode == "tf_crop_and_resize":
        if roi is None:
            raise ValueError("tf_crop_and_resize needs roi")
        roi_pairs = [(bb.normalize(pick(roi, k)), bb.normalize(pick(roi, len(axes) + k)))
                     for k in range(len(axes))]
    antialias = bool(attr.get("antialias", 0))
    extrapolation = float(attr.get("extrapolation_value", 0.0))
    comp = "float32" if dtype in ("float16", "bfloat16") else dtype
    y = x
    for k, a in enumerate(axes):
        n, out = dims[a], out_dims[k]
        o = bb.normalize(relax.op.arange(0, out, 1, "float64"))
        out_f = bb.normalize(relax.op.astype(relax.op.take(out_vec, relax.const(k, "int64"),
                                                           axis=0), "float64"))
        x_ori, mask = _x_original(o, s[k], n, out_f, coord_mode,
                                  None if roi_pairs is None else roi_pairs[k])
        x_ori = bb.normalize(x_ori)
        # Work with axis a last: the new dim (a fresh var) then only meets tensors built from
        # the same var, which keeps every shape known.
        perm = [i for i in range(rank) if i != a] + [a]
        yl = relax.op.permute_dims(y, perm) if a != rank - 1 else y
        if mode == "nearest":
            if antialias:
                raise ValueError("antialias is not defined for mode 'nearest'")
            idx = bb.normalize(_nearest_index(x_ori, n, text("nearest_mode", "round_prefer_floor")))
            yl = bb.normalize(relax.op.take(yl, idx, axis=rank - 1))
        elif mode in ("linear", "cubic"):
            w = _run_time_weights(bb, x_ori, s[k], n, mode, antialias,
                                  float(attr.get("cubic_coeff_a", -0.75)),
                                  bool(attr.get("exclude_outside", 0)))
            yc = relax.op.astype(yl, comp) if comp != dtype else yl
            yc = relax.op.matmul(yc, relax.op.permute_dims(relax.op.astype(w, comp), [1, 0]))
            yl = bb.normalize(relax.op.astype(yc, dtype) if comp != dtype else yc)
        else:
            raise ValueError(f"unknown mode '{mode}'")
        if mask is not None:
            fill = relax.op.astype(relax.const(np.array(extrapolation, dtype="float32")), dtype)
            yl = bb.normalize(relax.op.where(bb.normalize(mask), fill, yl))
        y = bb.normalize(relax.op.permute_dims(yl, [perm.index(i) for i in range(rank)])
                         if a != rank - 1 else yl)
    return y


@register("Upsample")
def upsample(bb, inputs, attr, params, opset):
    """Upsample (deprecated since opset 10) is Resize with asymmetric coordinates and floor
    rounding for nearest; scales are an attribute (opset 7) or an input (opset 9)."""
    import numpy as np
    from tvm import relax

    if opset < 9:
        scales = relax.const(np.array(attr["scales"], dtype="float32"))
    else:
        scales = inputs[1]
    mode = attr.get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    return Resize._convert(bb, [inputs[0], None, scales, None], {
        "mode": mode, "coordinate_transformation_mode": "asymmetric",
        "nearest_mode": "floor"}, params)
