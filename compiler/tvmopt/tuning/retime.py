"""The tune report's speed-ups, timed again side by side after the search.

The search measures each candidate once and keeps the least time of a task's candidates; the
default schedule (tuning/seed.py) is measured once too. The least of many noisy samples lies
below what the kernel takes (one quick sample among hundreds is enough), so a task's best
record leads its default schedule by more than it will in the build, and a record that only
won by noise shows a speed-up. After the search, each task whose best record beat its default
schedule is built both ways and the two run in alternating rounds on the same runner, a round
with the record first, the next with the default first; the report's speed-ups and the
whole-model estimate take these times. `compile --db` still decides per kernel on the
compile host (tuning/prefer.py); this only keeps `tune` from promising more than it found.
"""

from __future__ import annotations

import statistics
import warnings
from dataclasses import dataclass

ROUNDS = 3


@dataclass
class SideBySide:
    """A task's best record and default schedule, timed in the same rounds (mean seconds,
    median over the rounds)."""

    best_s: float
    default_s: float


def retime(tasks, results, db, hw, target, builder, runner) -> dict[int, SideBySide]:
    """Time each task whose best record measured faster than its default schedule against
    that schedule, in ROUNDS alternating rounds.

    Args:
        tasks: the tuned tasks; results: their TaskResults, in the same order.

    Returns:
        Task index -> SideBySide, for the tasks that built and ran both ways.
    """
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from ..errors import error_line
    from .seed import default_schedule

    device = "cpu" if target.kind.name == "llvm" else str(target.kind.name)
    todo = []  # (index, [record module, default module])
    for i, (task, res) in enumerate(zip(tasks, results)):
        if not res.led:
            continue
        rec = db.query_tuning_record(task.mod, target, task.name)
        if rec is None:
            continue
        try:
            best = s_tir.Schedule(task.mod)
            rec.trace.apply_to_schedule(best, remove_postproc=False)
            default, _ = default_schedule(task, hw, target)
        except Exception as err:  # pylint: disable=broad-except - a trace replay raises any type
            # The report keeps the search's figures for it; the warning says why.
            warnings.warn(f"tvmopt: {task.name} not timed side by side with its default "
                          f"schedule: {error_line(err)}")
            continue
        todo.append((i, [best.mod, default.mod]))
    if not todo:
        return {}
    mods = [m for _, pair in todo for m in pair]
    built = builder.build([ms.builder.BuilderInput(m, target) for m in mods])
    inputs = []
    for m, b in zip(mods, built):
        if b.error_msg:
            inputs.append(None)
            continue
        args = ms.arg_info.ArgInfo.from_entry_func(m, remove_preproc=True)
        inputs.append(ms.runner.RunnerInput(b.artifact_path, device, args))
    samples: list[list[float]] = [[] for _ in mods]
    for r in range(ROUNDS):
        # Record first in even rounds, default first in odd ones: neither side always runs
        # on the caches and clocks the other left behind.
        order = [k for j in range(len(todo)) for k in ((2 * j, 2 * j + 1) if r % 2 == 0
                                                       else (2 * j + 1, 2 * j))]
        order = [k for k in order if inputs[k] is not None]
        if not order:
            break
        for k, fut in zip(order, runner.run([inputs[k] for k in order])):
            out = fut.result()
            if not out.error_msg and out.run_secs:
                secs = [float(s) for s in out.run_secs]
                samples[k].append(sum(secs) / len(secs))
    timed = {}
    for j, (i, _) in enumerate(todo):
        best, default = samples[2 * j], samples[2 * j + 1]
        if len(best) == ROUNDS and len(default) == ROUNDS:
            timed[i] = SideBySide(statistics.median(best), statistics.median(default))
    return timed
