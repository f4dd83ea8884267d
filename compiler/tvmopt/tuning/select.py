"""Which tasks to tune: the ones that cost the model the most under the default schedules.

Trials spent on a kernel that is already fast, or that runs once on a tiny tensor, buy nothing;
so `--tasks slowest:N` times every task as it would run untuned (the default CPU schedule rules,
as `compile` builds it) and keeps the N with the largest time x calls per inference.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import TuningError
from .tasks import Task


@dataclass
class TaskCost:
    name: str
    weight: int
    default_ms: float | None  # None: could not be built or timed on this host

    @property
    def total_ms(self) -> float:
        return (self.default_ms or 0.0) * self.weight


def parse_selection(text: str | None) -> int | None:
    """'slowest:N' -> N; None/'all' -> None (every task)."""
    if text in (None, "", "all"):
        return None
    m = re.fullmatch(r"slowest:(\d+)", text.strip())
    if not m or int(m.group(1)) < 1:
        raise TuningError(f"--tasks '{text}': expected 'all' or 'slowest:N' with N >= 1")
    return int(m.group(1))


def default_schedule_ms(task: Task, target) -> float | None:
    """Best-of-5 ms of one call of the task's PrimFunc with the default schedule rules."""
    import tvm
    from tvm.s_tir import dlight as dl

    from ..codegen.cpu import default_rules
    from ..errors import error_line
    from ..timing import random_inputs, start_tvm_pool, time_call

    start_tvm_pool()  # ranked as the artifact would run them
    try:
        with target:
            mod = dl.ApplyDefaultSchedule(*default_rules())(task.mod)
        lib = tvm.compile(mod, target=target)
        dev = tvm.cpu()
        args = [tvm.runtime.tensor(a, dev)
                for a in random_inputs(mod["main"], np.random.default_rng(0))]
        return time_call(lib, "main", args)
    except Exception as err:  # pylint: disable=broad-except - building and running raise any type
        # The task ranks after every timed one (slowest); the warning says why it is untimed.
        warnings.warn(f"tvmopt: {task.name} not timed on its default schedule: "
                      f"{error_line(err)}")
        return None


def slowest(tasks: list[Task], hw, n: int) -> tuple[list[Task], list[TaskCost]]:
    """The `n` tasks with the most default-schedule time per inference, and every task's cost."""
    from ..errors import TargetError
    from ..targets.registry import check_host_can_run

    try:
        check_host_can_run(hw.device, hw.arch, hw.features)
    except TargetError as err:
        raise TuningError(f"--tasks slowest:N times the kernels on this host, which cannot run "
                          f"{hw.name} code ({err}); use --tasks all") from None
    target = hw.to_tvm()
    costs = [TaskCost(t.name, t.weight, default_schedule_ms(t, target)) for t in tasks]
    # Untimeable tasks rank by FLOPs after every timed one: no evidence they are slow.
    order = sorted(range(len(tasks)), key=lambda i: (costs[i].default_ms is None,
                                                     -costs[i].total_ms, -tasks[i].flops))
    keep = sorted(order[:n])
    return [tasks[i] for i in keep], costs
