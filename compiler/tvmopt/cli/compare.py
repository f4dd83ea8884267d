"""`tvmopt compare`: parse -> CompareOptions -> compare.run_compare -> print / write files."""

from __future__ import annotations

import shlex
import sys

import click

from . import options


def _name_list(ctx, param, value) -> list[str]:
    return [x.strip() for x in (value or "").split(",") if x.strip()]


@click.command()
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False), required=False)
@options.target("Target the models are compiled for and judged on (this host must run it).")
@click.option("--runtime", type=click.Choice(["tvmopt", "onnxruntime", "both"]),
              default="tvmopt", show_default=True, help="Which runtime(s) to compare on.")
@click.option("--precisions", callback=_name_list, metavar="fp32,fp16,int8",
              help="Compare precision variants of A instead of two models (int8: "
                   "onnxruntime's quantize_dynamic of A; fp16: refused where the target has "
                   "no fp16 arithmetic).")
@options.shapes("Shape overrides when compiling (repeatable; both models take them).")
@click.option("-o", "--output", type=click.Path(file_okay=False),
              help="Folder for artifacts and rewritten models [default: tvmopt-out/compare/A-vs-B].")
@click.option("--runs", type=int, default=30, show_default=True,
              help="Timed calls per model and runtime (interleaved).")
@click.option("--warmup", type=int, default=3, show_default=True)
@click.option("--max-seconds", type=float, default=30.0, show_default=True,
              help="Time budget of the interleaved loop (stops --runs early).")
@click.option("--profile-runs", type=int, default=10, show_default=True,
              help="Profiled runs per model and runtime.")
@click.option("--threads", type=int, help="Threads of every runtime [default: all cores].")
@click.option("--no-variants", is_flag=True,
              help="Do not build and time the recommended rewrites (predictions only).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the result JSON.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="Write a Markdown report.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Write a PNG: attribution waterfall and per-kernel profiles.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
def compare(a, b, target, runtime, precisions, shapes, output, runs, warmup, max_seconds,
            profile_runs, threads, no_variants, json_path, report_path, plot_path, quiet):
    """Why is B slower (or faster) than A on this target, and what to ship instead.

    A and B are .onnx models with the same inputs and outputs (B the "lightweight" variant);
    or one model with --precisions. Both are timed interleaved, profiled per kernel, the
    difference attributed to named causes, and the recommended variants built and timed.
    """
    from ..compare.precisions import run_precisions
    from ..compare.report import print_compare, write_json, write_markdown, write_plot
    from ..compare.run import CompareOptionError, CompareOptions, run_compare

    log = (lambda msg: None) if quiet else (lambda msg: click.echo(f"[compare] {msg}", err=True))
    common = dict(target=target, runtime=runtime, shapes=list(shapes), output=output, runs=runs,
                  warmup=warmup, max_seconds=max_seconds, profile_runs=profile_runs,
                  threads=threads, measure_variants=not no_variants)
    if precisions:
        if b is not None:
            raise CompareOptionError("give one MODEL with --precisions, or two models without it")
        docs = run_precisions(a, precisions, common, log=log)
    else:
        if b is None:
            raise CompareOptionError("give two models A B, or one model with --precisions")
        docs = [run_compare(CompareOptions(a=a, b=b, **common), log=log)]
    command = "tvmopt " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    for doc in docs:
        print_compare(doc)
    out = docs[0] if len(docs) == 1 else {"comparisons": docs}
    if json_path:
        write_json(out, json_path)
        click.echo(f"wrote {json_path}")
    if report_path:
        write_markdown(docs, report_path, command)
        click.echo(f"wrote {report_path}")
    if plot_path:
        write_plot(docs, plot_path)
        click.echo(f"wrote {plot_path}")

