"""Rich tables for tuning and database replay."""

from __future__ import annotations

from rich.table import Table

from ..console import console as _console


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.4g}"


def _us(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e6:.4g}"


def _count(n: float) -> str:
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def _fmt(s: float | None) -> str:
    return f"{_us(s)} µs" if s is not None and s < 1e-3 else f"{_ms(s)} ms"


def print_tune_result(result) -> None:
    """Per-task table (default vs best, speed-up, trials), the whole-model estimate, what the
    budget bought, and per task why a search ended early."""
    table = Table(title=f"tuning database {result.db_dir}")
    for col in ("task", "weight", "FLOPs", "default µs", "best µs", "speed-up", "side by side",
                "GFLOP/s", "trials"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for t in result.tasks:
        sb = t.side_by_side
        table.add_row(t.name, str(t.weight), _count(t.flops), _us(t.default_s), _us(t.best_s),
                      f"{t.default_s / t.best_s:.2f}x" if t.default_s and t.best_s else "-",
                      f"{sb.default_s / sb.best_s:.2f}x" if sb else "-",
                      "-" if t.gflops is None else f"{t.gflops:.1f}",
                      f"{t.trials_run}/{t.trials}")
    _console.print(table)
    if result.retimed:
        from .retime import ROUNDS

        _console.print(f"side by side: the best record and the default schedule of "
                       f"{result.retimed} task(s), timed again in {ROUNDS} alternating rounds "
                       "(the search's best is its luckiest sample); the estimate below uses "
                       "these, and the default schedule where the record lost")
    est, base = result.estimate_s, result.default_estimate_s
    if est is None:
        _console.print("whole-model estimate: n/a (some tasks have no valid measurement yet)")
    elif base is None:
        _console.print(f"whole-model estimate: {_fmt(est)} (sum of weight x best latency)")
    else:
        _console.print(f"whole-model estimate: default schedules {_fmt(base)} -> best {_fmt(est)}"
                       f" ({base / est:.2f}x; sum of weight x latency over the tuned kernels)")
    _print_library(result)
    unmeasured = [sd for sd in result.seeds if not sd.committed]
    for sd in unmeasured:
        _console.print(f"[yellow]default schedule of {sd.task} not recorded:[/] {sd.error}")
    _console.print(f"trials: {result.trials_before} before + {result.trials_run} this run"
                   + (f" (+ {len(result.seeds) - len(unmeasured)} default schedules measured)"
                      if result.seeds else "")
                   + f"; failed builds {result.build_failures}, failed runs "
                   f"{result.run_failures}; {result.wall_s:.1f} s")
    if result.standby:
        _console.print(f"standby: {result.standby} kernel(s) on oneDNN here recorded with their "
                       "default schedule (a compile that keeps them on codegen finds them)")
    _print_budget(result)
    for change in result.option_changes:
        _console.print(f"note: the database was tuned under other pipeline options: {change}")
    if result.sanitized.dropped:
        _console.print(f"[yellow]warning:[/] skipped {result.sanitized.dropped} corrupt or "
                       "truncated database lines")
    if result.interrupted:
        _console.print("[yellow]interrupted:[/] records measured so far are kept; "
                       "rerun the same command to continue")
    _print_load(result)


def _print_load(result) -> None:
    """Warn where other processes kept cores busy while tune measured: its times (the
    default column, the estimates and the floor) then overstate what the kernels take."""
    from ..timing import FOREIGN_LOAD_LIMIT

    what = {"defaults": "the default schedules", "search": "the search"}
    busy = {k: v for k, v in result.foreign_load.items() if v >= FOREIGN_LOAD_LIMIT}
    if busy:
        _console.print("[yellow]warning:[/] other processes used " + ", ".join(
            f"{v:.2f} cores while {what.get(k, k)} were measured" for k, v in busy.items())
            + ": a parallel kernel waits for a descheduled thread then, so these times can "
            "read many times what the kernel takes; tune again into a fresh --db on a quiet "
            "machine")


def _print_library(result) -> None:
    """The kernels tuning did not touch, and the whole model's kernel time before and after."""
    lib = result.library
    if lib is None:
        return
    if lib.untimed:
        _console.print(f"oneDNN: {lib.calls} kernel calls, not tuned ({lib.untimed} not timed "
                       "by the dispatch: no whole-model figure)")
        return
    rate = (f" ({lib.gflops:.0f} GFLOP/s: {lib.of_probe:.0%} of its large-matmul rate on "
            "this host)" if lib.of_probe is not None else "")
    _console.print(f"oneDNN: {lib.calls} kernel calls, {_fmt(lib.ms / 1e3)} per inference as "
                   f"the dispatch timed them{rate}, not tuned")
    from .library import ceiling

    before, after = result.untuned_total_s, result.tuned_total_s
    got = ceiling(lib, result.default_estimate_s)
    if before and after and got:  # None where some tasks were left out of the run
        share, floor = got
        _console.print(f"kernel time per inference: untuned {_fmt(before)} -> tuned "
                       f"{_fmt(after)} ({after / before:.2f}x; the tuned kernels held "
                       f"{share:.0%} of it, so no tuning could go below {floor:.2f}x)")


def _print_budget(result) -> None:
    """What share of the budget was spent and, when not all of it, why (never silent)."""
    from .tune import SPENT_ENOUGH

    parts = []
    if result.budget_trials is not None:
        parts.append(f"{result.trials_run} of {result.budget_trials} trials")
    if result.budget_s is not None:
        parts.append(f"{result.search_s / 60:.1f} of {result.budget_s / 60:.1f} min")
    if not parts:
        return
    why = {"trials": "trial budget reached", "time": "time budget reached",
           "Ctrl-C": "stopped by Ctrl-C",
           "exhausted": "every task's search ended before the budget"}.get(result.stopped_by, "")
    _console.print(f"budget: spent {', '.join(parts)}" + (f" ({why})" if why else ""))
    spent = result.spent
    every = spent is not None and spent < SPENT_ENOUGH or result.stopped_by == "exhausted"
    for t in result.tasks:
        if t.status and (every or t.status.startswith("not searched")):
            _console.print(f"  {t.name}: {t.status}")


def print_replay(replay) -> None:
    """One line per compile --db: hits, misses, skipped lines."""
    n = len(replay.hits) + len(replay.misses)
    msg = (f"database {replay.folder}: {len(replay.hits)}/{n} tasks served from the database, "
           f"{len(replay.misses)} fell back to default schedules")
    if replay.misses:
        msg += f" ({', '.join(replay.misses[:5])}{' ...' if len(replay.misses) > 5 else ''})"
    _console.print(msg)
    if replay.sanitized.dropped:
        _console.print(f"[yellow]warning:[/] skipped {replay.sanitized.dropped} corrupt or "
                       "truncated database lines")
