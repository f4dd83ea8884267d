"""CLI for autotuning: `tvmopt tune`, `tvmopt db prune`, `tvmopt rpc tracker|server`."""

from __future__ import annotations

import click

from .main import _default_model, main


@main.command()
@click.argument("model", type=click.Path(dir_okay=False), required=False)
@click.option("--target", "-t", default="x86", show_default=True, help="Target name or alias.")
@click.option("--trials", type=int, default=64, show_default=True,
              help="Total trial budget of the database; records already in it count.")
@click.option("--db", "db", type=click.Path(file_okay=False),
              help="Database folder [default: schedules/<model>/<target>/].")
@click.option("--max-trials-per-task", type=int, help="Cap on trials per task in this run.")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=1x3x224x224",
              help="Fix an input's shape (repeatable); recorded in the database manifest.")
@click.option("--rpc-tracker", metavar="HOST:PORT", help="Measure on servers of this RPC tracker.")
@click.option("--rpc-key", metavar="KEY", help="Device key the RPC servers registered with.")
@click.option("--trials-per-round", type=int, help="Candidates per task per round.")
@click.option("--prune-top-k", type=int, help="After tuning, keep only the best K records per task.")
@click.option("--population", type=int, default=512, show_default=True,
              help="Evolutionary-search population (smaller: faster rounds on few cores).")
@click.option("--weight-prepack", is_flag=True,
              help="CPU layout rewrite: let schedules choose weight layouts (prepacked at compile).")
@click.option("--missing-only", is_flag=True,
              help="Tune only the tasks without a valid record (after a pipeline change).")
def tune(model, target, trials, db, max_trials_per_task, shapes, rpc_tracker, rpc_key,
         trials_per_round, prune_top_k, population, weight_prepack, missing_only):
    """Tune MODEL.onnx with MetaSchedule (XGBoost cost model) into a resumable database."""
    from rich.console import Console

    from ..tuning.report import print_tune_result
    from ..tuning.tune import TuneOptions, prune, tune as run_tune

    opts = TuneOptions(model=model or _default_model(), target=target, trials=trials, db=db,
                       max_trials_per_task=max_trials_per_task, shapes=list(shapes),
                       rpc_tracker=rpc_tracker, rpc_key=rpc_key,
                       trials_per_round=trials_per_round, population=population,
                       weight_prepack=weight_prepack, missing_only=missing_only)
    console = Console(stderr=True)
    result = run_tune(opts, console=console)
    print_tune_result(result)
    if prune_top_k:
        before, after = prune(result.db_dir, prune_top_k)
        click.echo(f"pruned {result.db_dir}: {before} -> {after} records (top {prune_top_k})")
    if result.interrupted:
        raise SystemExit(130)


@main.group()
def db():
    """Inspect or shrink a tuning database folder."""


@db.command("prune")
@click.argument("folder", type=click.Path(file_okay=False, exists=True))
@click.option("--top-k", type=int, default=1, show_default=True)
def db_prune(folder, top_k):
    """Keep only the best TOP_K valid records per task (what gets committed)."""
    from pathlib import Path

    from ..tuning.tune import prune

    before, after = prune(Path(folder), top_k)
    click.echo(f"{folder}: {before} -> {after} records")


@main.group()
def rpc():
    """Start TVM RPC trackers and servers for distributed measurement."""


@rpc.command("tracker")
@click.option("--host", default="0.0.0.0", show_default=True)
@click.option("--port", type=int, default=9190, show_default=True)
def rpc_tracker(host, port):
    """Run a TVM RPC tracker (servers register with it; tune --rpc-tracker asks it)."""
    from ..tuning.rpc import run_tracker

    run_tracker(host, port)


@rpc.command("server")
@click.option("--tracker", "tracker", required=True, metavar="HOST:PORT")
@click.option("--key", required=True, help="Device key to register under.")
@click.option("--host", default="0.0.0.0", show_default=True)
@click.option("--port", type=int, default=9090, show_default=True,
              help="First port to try; the server takes the next free one.")
def rpc_server(tracker, key, host, port):
    """Run a TVM RPC server on this device, registered with TRACKER under KEY."""
    from ..tuning.rpc import run_server

    run_server(tracker, key, host, port)
