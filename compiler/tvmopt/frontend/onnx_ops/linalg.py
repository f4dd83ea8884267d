"""Det for small static matrices, by cofactor expansion.

TVM 0.27's Relax has no linear algebra ops. Models use Det on tiny matrices (2x2/3x3 geometry);
cofactor expansion over the n*n elements is exact arithmetic with no pivoting choices, and its
n! terms stay small up to n = 5. Larger or symbolic sizes are refused.
"""

from __future__ import annotations

from . import register

_MAX_N = 5


@register("Det")
def determinant(bb, inputs, attr, params, opset):
    from tvm import relax, tirx

    x = bb.normalize(inputs[0])
    shape = x.ty.shape.values
    ndim = len(shape)
    n, m = shape[-2], shape[-1]
    if not (isinstance(n, tirx.IntImm) and isinstance(m, tirx.IntImm)) or n.value != m.value:
        raise ValueError(f"Det needs static square matrices, got [..., {n}, {m}]")
    n = int(n.value)
    if n > _MAX_N:
        raise ValueError(f"Det of {n}x{n} matrices is not supported (at most {_MAX_N}x{_MAX_N})")
    elem = [[bb.emit(relax.op.squeeze(relax.op.strided_slice(
        x, [ndim - 2, ndim - 1], [i, j], [i + 1, j + 1]), [ndim - 2, ndim - 1]))
        for j in range(n)] for i in range(n)]
    memo = {}

    def det(row: int, cols: tuple):
        if len(cols) == 1:
            return elem[row][cols[0]]
        if cols in memo:
            return memo[cols]
        total = None
        for k, col in enumerate(cols):
            term = relax.op.multiply(elem[row][col], det(row + 1, cols[:k] + cols[k + 1:]))
            if total is None:
                total = term
            elif k % 2:
                total = relax.op.subtract(total, term)
            else:
                total = relax.op.add(total, term)
        memo[cols] = bb.emit(total)
        return memo[cols]

    return det(0, tuple(range(n)))
