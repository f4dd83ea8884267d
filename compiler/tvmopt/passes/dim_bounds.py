"""A Relax pass that gives symbolic dims the upper bounds the user declared (`--dim seq=1..512`).

StaticPlanBlockMemory reuses storage only between tensors whose sizes it can compare: with a
symbolic dim unbounded, every tensor sized by it gets its own allocation on every call (an
exported BERT with dynamic batch/seq: two dozen `alloc_storage` calls per inference). Given
`tir_var_upper_bound` on the function it plans each tensor at the bound, once, and shares that
storage like a static model's. The attribute applies to vars of the function's signature only.
"""

from __future__ import annotations

from ..errors import BuildError

UPPER_BOUND_ATTR = "tir_var_upper_bound"  # the name StaticPlanBlockMemory reads


def SetDimUpperBounds(bounds: dict[str, int]):  # noqa: N802 - named like TVM's pass constructors
    """The pass: `tir_var_upper_bound` on each Relax function whose signature has those dims.

    Raises:
        BuildError: a bounded name is no symbolic var of any function's signature (the
            importer named it differently), since the plan would silently ignore it.
    """
    import tvm
    from tvm import relax
    from tvm.relax.analysis import tir_vars_in_type

    @tvm.transform.module_pass(opt_level=0, name="tvmopt.SetDimUpperBounds")
    def transform(mod, _ctx):
        found = set()
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function):
                continue
            names = {v.name for p in func.params for v in tir_vars_in_type(p.ty)}
            mine = {k: int(v) for k, v in bounds.items() if k in names}
            if mine:
                found |= set(mine)
                # Keep the bounds the importer set (a torch.export Dim's range) for other dims.
                had = func.attrs.get(UPPER_BOUND_ATTR) if func.attrs is not None else None
                merged = {**{str(k): int(v) for k, v in dict(had or {}).items()}, **mine}
                mod[gv] = func.with_attr(UPPER_BOUND_ATTR, merged)
        missing = sorted(set(bounds) - found)
        if missing:
            raise BuildError(f"dim bound(s) {', '.join(missing)}: no such symbolic dim in the "
                             "compiled function's signature")
        return mod

    return transform
