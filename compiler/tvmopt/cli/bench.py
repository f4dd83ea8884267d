"""`tvmopt bench`: parse -> BenchOptions -> bench.suite.run_bench -> print / write files."""

from __future__ import annotations

import click

from . import options


def _int_list(ctx, param, value) -> list[int]:
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"'{value}': expected comma-separated integers, e.g. 1,8,32") from None
    if not out:
        raise click.BadParameter("give at least one batch size")
    return out


def _name_list(ctx, param, value) -> list[str]:
    return [x.strip() for x in (value or "").split(",") if x.strip()]


@click.command()
@click.argument("path", type=click.Path(), required=False)
@click.option("--model", type=click.Path(dir_okay=False),
              help="The model for baselines when PATH is an artifact [default: the file whose "
                   "sha256 the manifest records, beside the artifact or bundled].")
@options.target("Compile target when PATH is a model.")
@click.option("-o", "--output", type=click.Path(),
              help="Folder for artifacts compiled from a model [default: tvmopt-out/bench/STEM].")
@options.shapes("Shape overrides when compiling (repeatable).")
@click.option("--batch", "batches", default="1", show_default=True, callback=_int_list,
              help="Closed-loop batch sweep, e.g. 1,8,32.")
@options.dims("Value of a symbolic dim other than the batch, e.g. seq=128 (repeatable; "
              "default: the lower bound the artifact was compiled for, else 1). The report "
              "names the value each dim ran at.")
@click.option("--runs", type=int, default=50, show_default=True, help="Timed calls per runner and batch.")
@click.option("--warmup", type=int, default=5, show_default=True, help="Warm-up calls (reported apart).")
@click.option("--max-seconds", type=float, default=10.0, show_default=True,
              help="Time budget per batch size of the sweep (stops --runs early).")
@click.option("--baselines", default="", callback=_name_list,
              help="Comma list of ort, openvino (its default precision: bf16 on AMX CPUs), "
                   "openvino-f32 (its fp32 hint), torch (eager), torch.compile; each runs in a "
                   "worker process of its own. OpenVINO needs pip install 'tvmopt[baselines]'; "
                   "torch on a .pt2 runs its own module, on an .onnx needs onnx2torch.")
@click.option("--threads", type=int, help="onnxruntime / torch threads [default: all cores].")
@click.option("--load", type=click.Choice(["poisson", "burst"]),
              help="Open-loop load test through the dynamic-batching server.")
@click.option("--rate", type=float, default=50.0, show_default=True, help="Requests per second.")
@click.option("--duration", type=float,
              help="Seconds of the load test (default 10); without --load: soak for this long.")
@click.option("--burst", metavar="RATE:S,RATE:S,...",
              help="Burst phases [default: rate, 4x rate, rate, a third of --duration each].")
@click.option("--sizes", metavar="short:0.6,medium:0.3,long:0.1",
              help="Request-size mix (short=1, medium=4, long=16 items, or the model's sequence "
                   "dim if it has one; NAME=N:RATIO for other values).")
@click.option("--max-batch", type=int, default=8, show_default=True, help="Server: items per batch.")
@click.option("--max-wait-ms", type=float, default=5.0, show_default=True,
              help="Server: how long the oldest request waits for a fuller batch.")
@click.option("--timeout-ms", type=float, default=1000.0, show_default=True,
              help="Server: requests not started within this time out (0: never).")
@click.option("--max-queue", type=int, default=1000, show_default=True,
              help="Server: requests arriving to a full queue are dropped.")
@click.option("--soak", type=float, metavar="SECONDS",
              help="Soak for this long (also with --load; --duration alone means the same).")
@click.option("--profile-top", type=int, default=10, show_default=True,
              help="Rows of the per-kernel profile (0: skip).")
@click.option("--no-coldstart", is_flag=True, help="Skip the fresh-process cold-start measurement.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the result JSON.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), help="Write a flat CSV.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG of plots.")
@click.option("--generate", "generate", is_flag=True,
              help="Token generation on a decoder-with-past model: time to first token, "
                   "per-token decode latency, tokens/s for tvmopt and --baselines (ort always; "
                   "openvino, openvino-f32), greedy tokens checked against onnxruntime's, and a "
                   "memory-bandwidth floor per token (docs/generation.md). --runs: timed "
                   "generations per runtime [default 3 here]; --batch: prompts per generation.")
@click.option("--prompt-len", type=int, default=512, show_default=True,
              help="With --generate: prompt tokens (random ids from --seed).")
@click.option("--new-tokens", type=int, default=32, show_default=True,
              help="With --generate: tokens generated per run (the first by the prefill).")
@click.option("--rpc-tracker", metavar="HOST:PORT",
              help="Run on a remote device: a server of this TVM RPC tracker (tvmopt rpc).")
@click.option("--rpc-key", metavar="KEY", help="Device key the RPC servers registered with.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
@options.wide()
def bench(path, model, target, output, shapes, batches, dims, runs, warmup, max_seconds, baselines,
          threads, load, rate, duration, burst, sizes, max_batch, max_wait_ms, timeout_ms,
          max_queue, soak, profile_top, no_coldstart, seed, json_path, csv_path, plot_path, generate,
          prompt_len, new_tokens, rpc_tracker, rpc_key, quiet):
    """Latency and throughput of PATH (an artifact folder, or an .onnx/.pt2 compiled first).

    Closed-loop percentiles per batch size, baselines side by side, per-kernel profile, peak
    memory and cold start; with --load, an open-loop test through a dynamic-batching server;
    with only --duration, a soak that watches latency drift and RSS growth. With --rpc-tracker,
    the closed loop runs on a remote device's RPC server instead.
    """
    from ..bench.report import print_bench, write_csv, write_json, write_plot
    from ..bench.suite import BenchOptions, run_bench

    opts = BenchOptions(path=path or options.default_model(), model=model, target=target, output=output,
                        shapes=list(shapes), batches=batches, dims=options.parse_dims(dims),
                        runs=runs, warmup=warmup,
                        max_seconds=max_seconds, baselines=baselines, threads=threads, load=load,
                        rate=rate, duration=duration, burst=burst, sizes=sizes,
                        max_batch=max_batch, max_wait_ms=max_wait_ms, timeout_ms=timeout_ms,
                        max_queue=max_queue, coldstart=not no_coldstart, profile_top=profile_top,
                        seed=seed, soak=soak, rpc_tracker=rpc_tracker, rpc_key=rpc_key)
    log = (lambda msg: None) if quiet else (lambda msg: click.echo(f"[bench] {msg}", err=True))
    if generate:
        _generate(opts, click.get_current_context(), prompt_len, new_tokens, csv_path or plot_path,
                  json_path, log)
        return
    doc = run_bench(opts, log=log)
    print_bench(doc)
    for p, writer in ((json_path, write_json), (csv_path, write_csv), (plot_path, write_plot)):
        if p:
            writer(doc, p)
            click.echo(f"wrote {p}")


def _generate(opts, ctx, prompt_len, new_tokens, unsupported_file, json_path, log) -> None:
    """`bench --generate`: the generation harness (tvmopt.bench.generate)."""
    from ..bench.generate import GenerateOptions, print_generation, run_generate_bench
    from ..bench.report import write_json
    from ..bench.suite import BenchOptionError, resolve_artifacts

    if unsupported_file or opts.load or opts.soak or opts.rpc_tracker or len(opts.batches) > 1:
        raise BenchOptionError("--generate takes --json, --runs, --batch N (one size), "
                               "--baselines, --threads, --seed; not --csv/--plot, --load, "
                               "--soak/--duration, --rpc-tracker or a batch sweep")
    explicit = ctx.get_parameter_source("runs") != click.core.ParameterSource.DEFAULT
    gen = GenerateOptions(prompt_len=prompt_len, new_tokens=new_tokens,
                          rounds=opts.runs if explicit else 3, batch=opts.batches[0],
                          baselines=list(opts.baselines), threads=opts.threads, seed=opts.seed)
    arts, model = resolve_artifacts(opts, log)
    doc = run_generate_bench(next(iter(arts.values())), model, gen, log=log)
    print_generation(doc, echo=click.echo)
    if json_path:
        write_json(doc, json_path)
        click.echo(f"wrote {json_path}")
