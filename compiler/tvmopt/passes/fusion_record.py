"""Passes of the fuse phase that note what fusion did, in module attributes.

The planner reports kernels before and after fusion and the ops inside each fused kernel; it
reads both from the fused module the front half returns instead of re-running parts of the
fuse phase itself.
"""

from __future__ import annotations

KERNELS_BEFORE_FUSION = "tvmopt.kernels_before_fusion"
FUSED_OPS = "tvmopt.fused_ops"


def call_tir_calls(func) -> list:
    """The relax.call_tir calls in `func`'s body, in post order."""
    import tvm
    from tvm import relax

    calls = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_tir":
            calls.append(e)

    relax.analysis.post_order_visit(func.body, visit)
    return calls


def RecordKernelCount():  # noqa: N802 - named like TVM's pass constructors
    """After LegalizeOps: the number of kernels `main` calls before fusion."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="tvmopt.RecordKernelCount")
    def transform(mod, _ctx):
        from tvm import relax

        # Modules without a `main` (e.g. the dispatch timing's kernel modules): all functions.
        funcs = ([mod["main"]] if any(gv.name_hint == "main" for gv in mod.get_global_vars())
                 else [f for f in mod.functions.values() if isinstance(f, relax.Function)])
        return mod.with_attr(KERNELS_BEFORE_FUSION, sum(len(call_tir_calls(f)) for f in funcs))

    return transform


def RecordFusedOps():  # noqa: N802
    """After FuseOps, before FuseTIR: fused function name -> the legalized ops it calls."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="tvmopt.RecordFusedOps")
    def transform(mod, _ctx):
        ops = {}
        for gv, func in mod.functions.items():
            if func.attrs is not None and "Primitive" in func.attrs:
                ops[gv.name_hint] = [c.args[0].name_hint for c in call_tir_calls(func)]
        return mod.with_attr(FUSED_OPS, ops)

    return transform


def kernels_before_fusion(mod) -> int | None:
    """What RecordKernelCount noted on `mod` (None: the module did not go through it)."""
    value = (mod.attrs or {}).get(KERNELS_BEFORE_FUSION) if mod.attrs is not None else None
    return None if value is None else int(value)


def fused_ops(mod) -> dict[str, list[str]]:
    """What RecordFusedOps noted on `mod` ({} when it did not go through it)."""
    value = mod.attrs.get(FUSED_OPS) if mod.attrs is not None else None
    if value is None:
        return {}
    return {str(k): [str(op) for op in v] for k, v in value.items()}
