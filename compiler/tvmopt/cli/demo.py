"""`tvmopt demo`: the main job on the bundled model: compile, verify, run, time."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import click

from . import options

# The bundled model runs in a fraction of a millisecond: ten blocks per runtime spread each
# one's calls over several seconds, so a slow spell of a shared machine (another VM's burst)
# lands on every runtime alike instead of on one runtime's few blocks.
DEMO_ROUNDS = 10


def _note_load(rows) -> None:
    from ..timing import FOREIGN_LOAD_LIMIT

    load = rows[0].get("foreign_load", 0.0)
    if load >= FOREIGN_LOAD_LIMIT:
        click.echo(f"note: other processes kept {load:.1f} cores busy while this was timed; "
                   "tvmopt's kernels run as a team of threads that waits for any thread the "
                   "OS has set aside, so on a shared machine these figures (and which build "
                   "is faster) do not say what a quiet one would")


@click.command()
@click.option("--target", "-t", default=None,
              help="Target name or alias ('tvmopt targets' lists them), or 'host' [default: the "
                   "entry of targets/ this machine matches, e.g. x86-sapphirerapids, whose "
                   "committed tuning database the demo uses when there is one].")
@click.option("-o", "--output", type=click.Path(), default="tvmopt-out/default.tvmopt",
              show_default=True)
@click.option("--runs", type=int, default=1000, show_default=True,
              help="Timed calls per build and per onnxruntime (in ten interleaved rounds).")
def demo(target, output, runs):
    """The main job on the bundled model: compile, verify against onnxruntime, run, time."""
    from ..interface.compile import CompileOptions, compile_model
    from ..bench.quick import latency_summary
    from ..report import print_compile_result, print_latency_summary

    from ..models import DEFAULT
    from ..targets.registry import get_target, host_preset
    from ..tuning.database import bundled_db_dir, read_manifest

    if target is None:
        # The entry this machine matches, not 'host': a database tuned for an entry serves
        # every machine of that kind, one tuned for 'host' only machines identical to its own.
        preset = host_preset()
        target = preset.name if preset is not None else "host"
        click.echo(f"target {target}: the entry of targets/ this machine matches "
                   "(--target to choose another)")

    # The committed tuning database for this model and target, replayed with the shapes it was
    # tuned at; without one, the default schedules. With one, the untuned build is made and
    # timed too, in the same run: the demo keeps whichever is faster on this machine and says so.
    db = bundled_db_dir(DEFAULT, get_target(target).name)
    db_manifest = read_manifest(db) if db.is_dir() else None
    shapes = ([f"{k}={'x'.join(map(str, v))}" for k, v in db_manifest.get("shapes", {}).items()]
              if db_manifest else [])
    if not db_manifest:
        click.echo(f"no committed tuning database for {DEFAULT} on {target}: default schedules")
    opts = CompileOptions(model=options.default_model(), target=target, output=output, verify=True,
                          shapes=shapes, db=str(db) if db_manifest else None)
    result = compile_model(opts)
    print_compile_result(result)
    if result.replay is not None:
        from ..tuning.report import print_replay

        print_replay(result.replay)
    if not db_manifest:
        rows = latency_summary(result.artifact.path, opts.model, runs=runs, rounds=DEMO_ROUNDS)
        print_latency_summary(rows)
        _note_load(rows)
        return
    untuned_dir = Path(output).with_name(Path(output).name + ".untuned")
    untuned = compile_model(replace(opts, db=None, output=str(untuned_dir)),
                            log=lambda _line: None)
    rows = latency_summary(result.artifact.path, opts.model, runs=runs, rounds=DEMO_ROUNDS,
                           others={"tvmopt untuned": untuned.artifact.path})
    rows[0]["runtime"] = "tvmopt tuned"
    print_latency_summary(rows)
    _note_load(rows)
    tuned_ms, untuned_ms = rows[0]["median_ms"], rows[1]["median_ms"]
    if tuned_ms < untuned_ms:
        click.echo(f"the tuned build is faster here ({tuned_ms:.3f} vs {untuned_ms:.3f} ms "
                   f"untuned): kept at {output}")
        shutil.rmtree(untuned_dir, ignore_errors=True)
    else:
        # The database does not pay on this machine (tuned elsewhere, or for an older pipeline):
        # the faster build is the one to hand over.
        shutil.rmtree(output, ignore_errors=True)
        os.replace(untuned_dir, output)
        click.echo(f"the tuned build is NOT faster here ({tuned_ms:.3f} vs {untuned_ms:.3f} ms "
                   f"untuned): the untuned build is kept at {output}; tune for this machine "
                   f"with `tvmopt tune {opts.model} --target {target} "
                   f"{' '.join('--shape ' + s for s in shapes)} --minutes N --db DIR`")
