"""Kernels that take a symbolic scalar are kept out of fusion.

A run-time value that became a Relax PrimValue (`R.prim_value(past)`: the past length of a KV
cache, read from a tensor's shape) reaches a legalized kernel as a scalar parameter that is the
very TIR var the Relax function defines (`shape_to_tensor(past)` in `arange(seq) + past`, the
position ids of a decoder exported by torch's dynamo exporter or torch.export). When FuseOps
puts such a kernel in a group, FuseTIR gives the fused kernel that var twice, as the group's
own PrimValue parameter and as the inner kernel's, and TVM's RenewDefs stops on the second
definition ("VarRemapGet(source) == nullptr"). Marking those kernels opaque (after
AnnotateTIROpPattern) leaves them unfused: they compute a handful of scalars.
"""

from __future__ import annotations

import tvm
from tvm import tirx

# relay/relax OpPatternKind: kOpaque
_OPAQUE = 8


def _scalar_arg_callees(mod) -> set:
    """GlobalVars of the kernels some call_tir passes a scalar among its arguments (not as
    tir_vars, which FuseTIR carries as the group's shape parameter)."""
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    found = set()

    def visit(e):
        if isinstance(e, relax.Call) and e.op.same_as(call_tir) and len(e.args) > 1:
            args = e.args[1]
            fields = args.fields if isinstance(args, relax.Tuple) else [args]
            if any(isinstance(getattr(a, "ty", None), tvm.ir.PrimType) for a in fields):
                found.add(e.args[0])

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


@tvm.transform.module_pass(opt_level=0, name="tvmopt.OpaqueScalarKernels")
def OpaqueScalarKernels(mod, _ctx):  # noqa: N802 - a pass, named like TVM's
    updates = {}
    for gv in _scalar_arg_callees(mod):
        func = mod[gv]
        if isinstance(func, tirx.PrimFunc) and func.attrs is not None \
                and "op_pattern" in func.attrs and int(func.attrs["op_pattern"]) != _OPAQUE:
            updates[gv] = func.with_attr("op_pattern", _OPAQUE)
    if not updates:
        return mod
    mod = mod.clone()
    for gv, func in updates.items():
        mod[gv] = func
    return mod
