"""Small readers of Relax the other modules share: a composite's calls in order, an op test,
a var's binding, use counts, a float's bits as the int64 attrs carry them."""

from __future__ import annotations

import struct

import tvm
from tvm import relax



def _binding_of(mutator, e):
    if isinstance(e, relax.Var):
        return mutator.lookup_binding(e)  # None for a parameter: TVM returns it, raising nothing
    return None


def _is(e, name) -> bool:
    return isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == name


def _f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", float(v)))[0]


def _composite_ops(func: relax.Function):
    """Calls of the composite body in order, each with its args mapped to outer exprs."""
    body = func.body
    calls = []
    for block in body.blocks:
        for b in block.bindings:
            calls.append((b.var, b.value))
    return calls


# The ops of a chain that bound it (ReLU6 as clip, or as maximum / minimum by constants).
_CLIPS = ("relax.clip", "relax.maximum", "relax.minimum")


def _use_counts(func) -> dict:
    counts: dict = {}

    def visit(e):
        if isinstance(e, relax.Call):
            for a in e.args:
                if isinstance(a, relax.Var):
                    counts[a] = counts.get(a, 0) + 1
        elif isinstance(e, relax.Tuple):
            for a in e.fields:
                if isinstance(a, relax.Var):
                    counts[a] = counts.get(a, 0) + 1

    relax.analysis.post_order_visit(func, visit)
    return counts
