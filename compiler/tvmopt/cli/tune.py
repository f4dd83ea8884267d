"""`tvmopt tune`: tune a model with MetaSchedule into a resumable database folder."""

from __future__ import annotations

import click

from . import options


@click.command()
@options.model_argument()
@options.target()
@click.option("--trials", type=int,
              help="Total trial budget of the database; records already in it count "
                   "[default: 64, or none with --minutes].")
@click.option("--minutes", type=float,
              help="Wall-clock budget of this run's search; with --trials, the first reached ends it.")
@click.option("--db", "db", type=click.Path(file_okay=False),
              help="Database folder [default: schedules/<model>/<target>/].")
@click.option("--max-trials-per-task", type=int, help="Cap on trials per task in this run.")
@options.shapes("Fix an input's shape (repeatable); recorded in the database manifest.")
@click.option("--rpc-tracker", metavar="HOST:PORT", help="Measure on servers of this RPC tracker.")
@click.option("--rpc-key", metavar="KEY", help="Device key the RPC servers registered with.")
@click.option("--trials-per-round", type=int, help="Candidates per task per round.")
@click.option("--prune-top-k", type=int, help="After tuning, keep only the best K records per task.")
@click.option("--population", type=int, default=512, show_default=True,
              help="Evolutionary-search population (smaller: faster rounds on few cores).")
@click.option("--weight-prepack", is_flag=True,
              help="CPU layout rewrite: let schedules choose weight layouts (prepacked at compile).")
@click.option("--missing-only", is_flag=True,
              help="Tune only the tasks without a valid record (after a pipeline change or "
                   "with other options: compile names them).")
@click.option("--tasks", "task_selection", default="all", show_default=True, metavar="all|slowest:N",
              help="slowest:N: time every kernel under the default schedules on this host first "
                   "and tune only the N that cost the most per inference.")
@options.precision()
@options.max_error("compile's accuracy gate, which tune runs first where library calls go to a "
                   "lower precision (bf16): the largest error allowed (default 0.02). Give "
                   "compile the same, so its gate keeps the module tuned here.")
@options.calibration("An .npz of sample inputs for that gate (as compile's --calibration).")
@options.dispatch("Leave out of tuning the conv2d/matmul kernels compile would give oneDNN: "
                  "auto (those timing faster there), library (all it takes), codegen (none). "
                  "Compile with the same setting.")
def tune(model, target, trials, minutes, db, max_trials_per_task, shapes, rpc_tracker, rpc_key,
         trials_per_round, prune_top_k, population, weight_prepack, missing_only, task_selection,
         precision, max_error, calibration, dispatch):
    """Tune MODEL (.onnx or .pt2) with MetaSchedule (XGBoost cost model) into a resumable database."""
    from ..interface.tune import tune as run_tune
    from ..tuning.report import print_tune_result
    from ..tuning.tune import TuneOptions
    from ..tuning.database import prune

    opts = TuneOptions(model=model or options.default_model(), target=target, trials=trials, db=db,
                       minutes=minutes, precision=precision,
                       max_trials_per_task=max_trials_per_task, shapes=list(shapes),
                       rpc_tracker=rpc_tracker, rpc_key=rpc_key,
                       trials_per_round=trials_per_round, population=population,
                       weight_prepack=weight_prepack, missing_only=missing_only,
                       tasks=task_selection, dispatch=dispatch, max_error=max_error,
                       calibration=calibration)
    result = run_tune(opts, console=options.err_console)
    print_tune_result(result)
    if prune_top_k:
        before, after = prune(result.db_dir, prune_top_k)
        click.echo(f"pruned {result.db_dir}: {before} -> {after} records (top {prune_top_k})")
    if result.interrupted:
        raise SystemExit(130)
