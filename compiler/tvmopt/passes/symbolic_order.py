"""A Relax pass that puts each binding after the `match_cast` that defines its symbolic dims.

A shape known only at run time reaches kernels through `match_cast(shape, R.Shape([n]))`, which
defines the symbolic var `n`. TVM 0.27's FuseOps tracks only Relax-variable dependencies: when a
fused group holds ops from both sides of that `match_cast` (say a scalar computed from an input
before it, and an `arange(n)` after), it emits the group at its first op, before `n` exists, and
FuseTIR then drops the now "unused" `match_cast`; the build fails with "PrimExpr n ... has not
been computed" (window functions, Range over a computed length, reductions over run-time axes).
Running this after FuseOps restores a valid order: a stable topological sort of each dataflow
block over both kinds of dependency. A block whose dependencies form a cycle is left as it is.
"""

from __future__ import annotations


def _tir_vars(expr) -> set:
    """Symbolic vars an expression's value or type mentions (call args, shapes, out types)."""
    from tvm import relax
    from tvm.error import InternalError
    from tvm.relax.analysis import tir_vars_in_type

    found = set()

    def visit(e):
        try:
            found.update(tir_vars_in_type(e.ty))
        except InternalError:
            # An expression without a populated type: TVM's TypeFunctor ICHECKs that it
            # "cannot visit Type::Missing()". It mentions no symbolic var.
            pass
        if isinstance(e, relax.Call):
            for arg in e.args:
                visit(arg)
            for ty_arg in getattr(e, "ty_args", []) or []:
                found.update(tir_vars_in_type(ty_arg))
        elif isinstance(e, relax.Tuple):
            for f in e.fields:
                visit(f)

    visit(expr)
    return found


def _reorder(block, entry_defined: set):
    from tvm import relax
    from tvm.relax.analysis import free_vars, tir_vars_in_type

    bindings = list(block.bindings)
    var_at = {b.var: i for i, b in enumerate(bindings)}
    defined_at = {}
    for i, b in enumerate(bindings):
        if isinstance(b, relax.MatchCast):
            for v in tir_vars_in_type(b.ty):
                if v not in entry_defined and v not in defined_at:
                    defined_at[v] = i
    deps = []
    for i, b in enumerate(bindings):
        d = {var_at[v] for v in free_vars(b.value) if v in var_at}
        used = _tir_vars(b.value) | set(tir_vars_in_type(b.var.ty))
        d |= {defined_at[v] for v in used if v in defined_at and defined_at[v] != i}
        d.discard(i)
        deps.append(d)
    if all(j < i for i, d in enumerate(deps) for j in d):
        return block  # already in order
    order, done = [], set()
    while len(order) < len(bindings):
        ready = next((i for i in range(len(bindings)) if i not in done and deps[i] <= done), None)
        if ready is None:
            return block  # a cycle: nothing this pass can fix
        order.append(ready)
        done.add(ready)
    return relax.DataflowBlock([bindings[i] for i in order], block.span)


def OrderSymbolicDefs():  # noqa: N802 - named like TVM's pass constructors
    """The pass (a function pass over every Relax function of the module)."""
    import tvm
    from tvm import relax
    from tvm.relax.analysis import tir_vars_in_type

    @tvm.transform.module_pass(opt_level=0, name="tvmopt.OrderSymbolicDefs")
    def transform(mod, _ctx):
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            entry = set()
            for p in func.params:
                entry.update(tir_vars_in_type(p.ty))
            blocks = [(_reorder(b, entry) if isinstance(b, relax.DataflowBlock) else b)
                      for b in func.body.blocks]
            if all(a.same_as(b) for a, b in zip(blocks, func.body.blocks)):
                continue
            body = relax.SeqExpr(blocks, func.body.body, func.body.span)
            new = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs,
                                 func.span)
            mod[gv] = new
        return mod

    return transform
