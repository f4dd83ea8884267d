"""The precision policy: the registry of schemes (`schemes.SCHEMES`) and the rule that runs them.

    auto never picks a precision the target lacks fast instructions for, or one the plan predicts
    (or, for library kernels, times) slower than fp32; every refusal or downgrade becomes a
    `Decision` that is printed and stored.
"""

from __future__ import annotations

from ..errors import TargetError
from ..targets.registry import HardwareTarget
from .costs import KernelPlan
from .schemes import INTERNAL, SCHEMES, Context, Decision, Scheme

CHOICES = tuple(n for n in SCHEMES if n not in INTERNAL)


def parse(name: str) -> Scheme:
    """The scheme called `name`.

    Raises:
        TargetError: unknown name (the message lists the choices).
    """
    if name not in CHOICES:
        raise TargetError(f"unknown precision '{name}' (choose from {', '.join(CHOICES)})")
    return SCHEMES[name]


def decide(hw: HardwareTarget, kernels: list[KernelPlan], requested: str,
           library: list | None = None) -> tuple[str, list[Decision]]:
    """Apply the precision rule; set each kernel's precision and reason. Returns (model precision,
    decisions).

    Args:
        library: this build's per-kernel library dispatch choices (bf16 on CPU is decided there,
            by timing, and reported here).
    """
    parse(requested)
    ctx = Context(hw, kernels, requested, list(library or []))
    ctx.set_all("fp32", "fp32 baseline")
    for scheme in SCHEMES.values():
        scheme.consider(ctx)
    return ctx.model_precision, ctx.decisions


__all__ = ["CHOICES", "SCHEMES", "Decision", "Scheme", "decide", "parse"]
