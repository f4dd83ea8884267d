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


def _scheduled(work) -> bool:
    """A function written already scheduled (a recurrent layer's loop kernel, generic in its
    sequence and batch dims): MetaSchedule can neither time nor schedule it, and the build
    keeps it as written, so no database record could apply to it."""
    return any(obj.attrs is not None and bool(obj.attrs.get("tirx.is_scheduled", False))
               for obj in (work, work["main"]))


def _run_time_sized(work) -> bool:
    """A function with an argument whose size is known only at run time (a size computed from
    the data, or a shape the import could not fold, as an anchor grid's `arange` over a feature
    map's size): MetaSchedule times a candidate on arguments of fixed sizes, so it can measure
    none of them, and a record keyed on a symbolic workload serves no other size anyway."""
    from tvm import tirx

    return any(not isinstance(d, tirx.IntImm)
               for p in work["main"].params if isinstance(p.ty, tirx.BufferType)
               for d in p.ty.shape)


SCHEDULED = "written already scheduled"
RUN_TIME_SIZED = "sized at run time"


def extract_tasks(mod, target, left_out: dict | None = None) -> list[Task]:
    """The tunable fused functions of `mod`, in MetaSchedule's order.

    Args:
        left_out: when given, filled with why -> names of the functions that are no task:
            SCHEDULED (a recurrent layer's loop kernel) or RUN_TIME_SIZED.
    """
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    out = []
    for t in ms.relax_integration.extract_tasks(mod, target):
        work = t.dispatched[0]
        why = SCHEDULED if _scheduled(work) else RUN_TIME_SIZED if _run_time_sized(work) else None
        if why is not None:
            if left_out is not None:
                left_out.setdefault(why, []).append(t.task_name)
            continue
        try:
            flops = float(estimate_tir_flops(work))
        except RuntimeError:
            # A statement TVM's estimator has no case for: its visitor's LOG(FATAL), an
            # InternalError (a RuntimeError). The task has no FLOP estimate.
            flops = 0.0
        out.append(Task(t.task_name, int(t.weight), work, flops))
    return out
