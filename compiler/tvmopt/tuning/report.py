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


def print_tune_result(result) -> None:
    """Per-task table (FLOPs, best latency, GFLOP/s, trials) plus the whole-model estimate."""
    table = Table(title=f"tuning database {result.db_dir}")
    for col in ("task", "weight", "FLOPs", "best µs", "GFLOP/s", "trials"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for t in result.tasks:
        table.add_row(t.name, str(t.weight), _count(t.flops), _us(t.best_s),
                      "-" if t.gflops is None else f"{t.gflops:.1f}", str(t.trials))
    _console.print(table)
    est = result.estimate_s
    shown = f"{_us(est)} µs" if est is not None and est < 1e-3 else f"{_ms(est)} ms"
    _console.print(f"whole-model estimate: {shown} (sum of weight x best latency)"
                   if est is not None else
                   "whole-model estimate: n/a (some tasks have no valid measurement yet)")
    _console.print(f"trials: {result.trials_before} before + {result.trials_run} this run; "
                   f"failed builds {result.build_failures}, failed runs {result.run_failures}; "
                   f"{result.wall_s:.1f} s")
    if result.sanitized.dropped:
        _console.print(f"[yellow]warning:[/] skipped {result.sanitized.dropped} corrupt or "
                       "truncated database lines")
    if result.interrupted:
        _console.print("[yellow]interrupted:[/] records measured so far are kept; "
                       "rerun the same command to continue")


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
