"""The one way tvmopt's Relax mutators walk a module."""

from __future__ import annotations

from tvm import relax


def rewrite_functions(mutator, mod, only=None):
    """`mod` with each Relax function (each one `only(func)` accepts, when given) visited by
    `mutator`, a PyExprMutator made with `mod`; other functions are left as they are."""
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and (only is None or only(func)):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()
