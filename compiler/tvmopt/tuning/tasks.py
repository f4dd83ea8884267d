"""Tuning tasks: the fused PrimFuncs of a module after the pipeline's fusion phase."""

from __future__ import annotations

from dataclasses import dataclass

from ..pipeline import FRONT_HALF

# The phase after which tasks are extracted and the database is applied: the front half's end.
TUNE_AFTER_PHASE = FRONT_HALF


@dataclass
class Task:
    """One tuning task: a fused PrimFunc of the model and how often the model calls it."""

    name: str
    weight: int
    mod: object  # IRModule holding the PrimFunc as "main"
    flops: float


def extract_tasks(mod, target) -> list[Task]:
    """The tunable fused functions of `mod`, in MetaSchedule's order."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    out = []
    for t in ms.relax_integration.extract_tasks(mod, target):
        work = t.dispatched[0]
        try:
            flops = float(estimate_tir_flops(work))
        except Exception:  # opaque loops (e.g. data-dependent gathers) have no estimate
            flops = 0.0
        out.append(Task(t.task_name, int(t.weight), work, flops))
    return out
