"""DFT as two real matmuls against a precomputed DFT matrix (static length along the axis).

TVM 0.27's Relax has no FFT. For the short signals of models that use DFT (spectrogram front
ends) an O(n^2) matmul is what TVM schedules well anyway. The matrix follows the ONNX reference
(numpy.fft): forward e^{-i2pi kn/N}; inverse e^{+i2pi kn/N}/N; inverse + onesided is irfft
(Hermitian input, real output). `dft_length` and opset-20's `axis` must be constants.
"""

from __future__ import annotations

from . import register


def _const_int(value, what: str) -> int | None:
    import tvm

    if value is None:
        return None
    if not isinstance(value, tvm.ir.GenericConst):
        raise ValueError(f"DFT {what} is computed at run time: only a constant is supported")
    return int(value.value.numpy().reshape(-1)[0])


def _matrix(n_used: int, length: int, inverse: bool, onesided: bool):
    """Complex matrix W[n, k] so that out[k] = sum_n x[n] W[n, k]."""
    import numpy as np

    if inverse and onesided:  # irfft: k runs over the given half spectrum, n over N outputs
        k = np.arange(n_used)[:, None]
        n = np.arange(length)[None, :]
        weight = np.where((k == 0) | ((length % 2 == 0) & (k == length // 2)), 1.0, 2.0)
        weight = np.where(k > length // 2, 0.0, weight)
        return weight * np.exp(2j * np.pi * k * n / length) / length
    n = np.arange(n_used)[:, None]
    out = (length // 2 + 1) if onesided else length
    k = np.arange(out)[None, :]
    if inverse:
        return np.exp(2j * np.pi * k * n / length) / length
    return np.exp(-2j * np.pi * k * n / length)


@register("DFT")
def dft(bb, inputs, attr, params, opset):
    from tvm import relax, tirx

    x = bb.normalize(inputs[0])
    dtype = str(x.ty.dtype)
    shape = x.ty.shape.values
    ndim = len(shape)
    if opset >= 20:
        axis = _const_int(inputs[2] if len(inputs) > 2 else None, "axis")
        axis = -2 if axis is None else axis
    else:
        axis = attr.get("axis", 1)
    axis = axis % ndim
    if axis == ndim - 1:
        raise ValueError("DFT axis cannot be the last (real/imaginary) axis")
    inverse, onesided = bool(attr.get("inverse", 0)), bool(attr.get("onesided", 0))
    n_in = shape[axis]
    if not isinstance(n_in, tirx.IntImm):
        raise ValueError(f"DFT needs a static length on axis {axis}, got {n_in}")
    n_in = int(n_in.value)
    length = _const_int(inputs[1] if len(inputs) > 1 else None, "dft_length")
    if length is None:
        length = 2 * (n_in - 1) if inverse and onesided else n_in
    n_used = min(n_in, length // 2 + 1 if inverse and onesided else length)
    w = _matrix(n_used, length, inverse, onesided)
    wr, wi = relax.const(w.real.astype(dtype)), relax.const(w.imag.astype(dtype))

    # [..., n, ..., c] -> real/imag parts with the DFT axis last, first n_used entries.
    x = relax.op.strided_slice(x, [axis], [0], [n_used])
    parts = [relax.op.squeeze(relax.op.strided_slice(x, [ndim - 1], [i], [i + 1]), [ndim - 1])
             for i in range(int(shape[-1].value))]
    perm = [d for d in range(ndim - 1) if d != axis] + [axis]
    back = list(range(ndim - 2))
    back.insert(axis, ndim - 2)
    a = bb.emit(relax.op.permute_dims(parts[0], perm))
    re = relax.op.matmul(a, wr)
    im = relax.op.matmul(a, wi)
    if len(parts) > 1:
        b = bb.emit(relax.op.permute_dims(parts[1], perm))
        re = relax.op.subtract(re, relax.op.matmul(b, wi))
        im = relax.op.add(im, relax.op.matmul(b, wr))
    outs = [re] if inverse and onesided else [re, im]
    outs = [relax.op.permute_dims(bb.emit(o), back) for o in outs]
    return relax.op.stack(outs, axis=ndim - 1)
