"""Untuned speed: tvmopt with no database against onnxruntime, OpenVINO and PyTorch, same run,
same threads, each runtime in its own process.

Builds ResNet-18, MobileNetV2, a 4-layer BERT encoder and a 4-layer GPT-2 decoder (hidden 256,
seq 128), plus a ConvNeXt-style CNN and a wide MLP (`tools/torch_models.py`, random weights,
fixed seeds), exported with torch.onnx.export at opset 17 at each batch size; compiles each with
every `--dispatch` and `--precision` given (default: `--dispatch codegen,auto`, precision auto,
which on a CPU with AMX or AVX512-BF16 puts bf16 library kernels where each times faster, behind
the accuracy gate), no tuning database. Then every runtime runs in a worker process of its own
(tvmopt.bench.isolated): tvmopt's builds, onnxruntime (CPU provider), OpenVINO with its default
precision (bf16 on AMX) and with the fp32 hint (when `openvino` is installed), and PyTorch eager,
timed in blocks whose order alternates by round. Prints medians, P95, ratios to onnxruntime,
each runtime's error against onnxruntime, the geometric means, the compile times and the host
(CPU model and the features that decide precision).

`--models hf:resnet50,hf:vit_small,...` takes published architectures from `transformers`
instead (tools/hf_models.py: upstream implementations, random weights): models this project's
rules were not written against.

`--tune-minutes N` also tunes each model for N minutes (`tvmopt tune --minutes N`, with the
first `--dispatch` and `--precision`, into a fresh database under OUT/dbs/), compiles it from
that database and times that build (`tvmopt-tuned`) in the same run, each in its own process:
what tuning buys over the untuned build and onnxruntime.

`--models dyn:bert4l,dyn:gpt2_4l` exports the token models with symbolic batch and sequence
(dynamic_axes, as transformers are deployed), compiles that file once (`--dim` bounds from
`--seqs` and `--batches`) and times the one artifact at every `--seqs` length and batch, beside
tvmopt's build of the same model exported with static shapes at that length
(`tvmopt-static`) and the baselines on the dynamic file. `dyn:resnet18` (any other model)
does the same with a symbolic batch only, timed at every `--batches` size.

Usage:
  python tools/bench_default.py [--models resnet18,bert4l,hf:resnet50] [--batches 1,8]
                                [--dispatch auto] [--precision fp32,auto]
                                [--baselines onnxruntime,openvino,openvino-f32,torch]
                                [--threads 2] [--runs 20] [--out DIR] [--json results.json]
  python tools/bench_default.py --markdown-from results.json   # the tables in docs/
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BASELINES = ("onnxruntime", "openvino", "openvino-f32", "torch")


def _args(argv):
    import torch_models

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(torch_models.MODELS),
                    help="names from tools/torch_models.py, or hf:NAME from tools/hf_models.py")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--seqs", default="32,128,512",
                    help="sequence lengths each dyn: model is timed at (one artifact)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=20, help="timed calls per runtime and row")
    ap.add_argument("--block", type=int, default=5, help="calls per runtime before switching")
    ap.add_argument("--dispatch", default="codegen,auto")
    ap.add_argument("--precision", default="auto",
                    help="tvmopt precisions to build (each with every --dispatch), e.g. fp32,auto")
    ap.add_argument("--int8", default="",
                    help="also bench each model's onnxruntime quantization, 'static' (QDQ, "
                         "per-channel) and/or 'dynamic': the int8 file compiled by tvmopt and "
                         "run by the baselines, beside tvmopt's build of the fp32 original")
    ap.add_argument("--tune-minutes", type=float, default=None, metavar="N",
                    help="also tune each model for N minutes (tvmopt tune --minutes N, the "
                         "first --dispatch and --precision) into OUT/dbs/ and time the build "
                         "compiled from that database (tvmopt-tuned) beside the untuned ones")
    ap.add_argument("--baselines", default=",".join(BASELINES),
                    help="onnxruntime is always run (the ratios' base); openvino and "
                         "openvino-f32 are skipped when openvino is not installed")
    ap.add_argument("--target", default="host",
                    help="tvmopt target; 'host' uses this CPU's vector width, as onnxruntime and "
                         "PyTorch do at run time ('x86' is the portable AVX2 build)")
    ap.add_argument("--out", default="tvmopt-out/bench-default", help="models and artifacts")
    ap.add_argument("--json", dest="json_path", default=None)
    ap.add_argument("--markdown-from", default=None, metavar="JSON",
                    help="print the Markdown tables of a results file written by --json, "
                         "measuring nothing (what docs/performance.md shows)")
    return ap.parse_args(argv)


def geomean(ratios) -> float:
    import numpy as np

    return float(np.exp(np.log(np.asarray(ratios, dtype=float)).mean()))


def summarize(rows: list[dict]) -> dict:
    """Geometric means of the ratios to onnxruntime per group of rows, printed and returned."""
    import numpy as np

    summary = {}
    for group, members in (("fp32 models", [r for r in rows if "int8)" not in r["model"]
                                            and not r["model"].startswith("dyn:")]),
                           ("dynamic-shape models", [r for r in rows
                                                    if r["model"].startswith("dyn:")]),
                           ("int8 models", [r for r in rows if "int8)" in r["model"]])):
        if not members:
            continue
        # A runtime that could not load some model (OpenVINO refuses some exports) is
        # summarised over the rows it ran, said so, and over the rows every runtime ran.
        keys = list(dict.fromkeys(k for r in members for k in r["ms"]))
        common = [r for r in members if all(k in r["ms"] for k in keys)]
        print(f"-- {group} ({len(members)} rows)")
        for k in keys:
            ran = [r for r in members if k in r["ms"]]
            ratios = np.array([r["ms"][k]["ratio_to_ort"] for r in ran])
            summary[f"{group}: {k}"] = s = {
                "geomean_ratio": round(geomean(ratios), 3),
                "worst_ratio": round(float(ratios.max()), 3),
                "worst_rel_err": max(r["rel_err"][k] for r in ran), "rows": len(ran)}
            if len(common) < len(members):
                s["geomean_ratio_common_rows"] = round(geomean(
                    [r["ms"][k]["ratio_to_ort"] for r in common]), 3)
            print(f"geomean ratio to onnxruntime, {k}: {s['geomean_ratio']:.2f}x "
                  + (f"on {len(ran)} of {len(members)} rows " if len(ran) < len(members) else "")
                  + (f"({s['geomean_ratio_common_rows']:.2f}x on the {len(common)} row(s) every "
                     "runtime ran) " if "geomean_ratio_common_rows" in s else "")
                  + f"(worst {s['worst_ratio']:.2f}x; error vs onnxruntime up to "
                  f"{s['worst_rel_err']:.1e})")
    return summary


def markdown(results: dict) -> str:
    """The rows of a --json results file as Markdown tables (the fp32 models, the dynamic-shape
    models, then the int8 quantizations), each with its geometric means and largest errors."""
    rows = results["rows"]
    host = results.get("host")
    out = []
    if isinstance(host, dict):
        out += [f"Host: {host['cpu']}, {host['cores']} cores ({' '.join(host['features'])}); "
                f"{results['threads']} threads per runtime, "
                f"{results.get('isolation', 'one process')}.", ""]
    for members in ([r for r in rows if "int8)" not in r["model"]
                     and not r["model"].startswith("dyn:")],
                    [r for r in rows if r["model"].startswith("dyn:")],
                    [r for r in rows if "int8)" in r["model"]]):
        if members:
            out += _table(members) + [""]
    return "\n".join(out).rstrip()


def _table(rows: list[dict]) -> list[str]:
    runners = list(dict.fromkeys(k for r in rows for k in r["ms"]))
    builds = [r for r in runners if r.startswith("tvmopt-")]
    others = [r for r in runners if not r.startswith("tvmopt-") and r != "onnxruntime"]
    compiled = [b for b in builds if b[len("tvmopt-"):] in rows[0]["compile_s"]]
    head = (["model", "batch"] + [f"{b} P50 (x ort)" for b in builds]
            + ["onnxruntime P50"] + [f"{o} P50 (x ort)" for o in others]
            + ["compile " + " / ".join(b[len("tvmopt-"):] for b in compiled)])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cell = {k: f"{v['p50']:.2f} ms ({v['ratio_to_ort']:.2f}x)" for k, v in r["ms"].items()}
        cell = {k: cell.get(k, "-") for k in runners}  # a runtime that could not load it
        out.append("| " + " | ".join(
            [r["model"], str(r["batch"])] + [cell[b] for b in builds]
            + [f"{r['ms']['onnxruntime']['p50']:.2f} ms"] + [cell[o] for o in others]
            + [" / ".join(f"{r['compile_s'].get(b[len('tvmopt-'):], 0):.1f} s"
                          for b in compiled)])
            + " |")
    out += ["", "| rows | " + " | ".join(builds + others) + " |",
            "|---|" + "---|" * (len(builds) + len(others))]
    ratio = {k: [r["ms"][k]["ratio_to_ort"] for r in rows if k in r["ms"]] for k in runners}
    out.append(f"| {len(rows)} rows, geometric mean (worst) | " + " | ".join(
        f"{geomean(ratio[k]):.2f}x ({max(ratio[k]):.2f}x)"
        + (f" on {len(ratio[k])} rows" if len(ratio[k]) < len(rows) else "")
        for k in builds + others) + " |")
    # the same rows for every runtime: those every runtime could run
    common = [r for r in rows if all(k in r["ms"] for k in runners)]
    if len(common) < len(rows):
        out.append(f"| {len(common)} rows every runtime ran, geometric mean | " + " | ".join(
            f"{geomean([r['ms'][k]['ratio_to_ort'] for r in common]):.2f}x"
            for k in builds + others) + " |")
    if all("rel_err" in r for r in rows):
        out.append("| largest error vs onnxruntime (max abs / max ref) | " + " | ".join(
            f"{max(r['rel_err'][k] for r in rows if k in r['rel_err']):.1e}"
            for k in builds + others) + " |")
    return out


def _source(name: str):
    """(module that builds and exports it, its name there)."""
    if name.startswith("hf:"):
        import hf_models

        return hf_models, name[3:]
    import torch_models

    return torch_models, name


def host_description() -> dict:
    """The CPU every figure of a run comes from, and the features that decide precision."""
    import platform

    from tvmopt.targets.registry import host_cpu_features

    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f
                          if ln.startswith("model name")), "")
    except OSError:
        pass
    feats = host_cpu_features()
    keys = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
            "amx_bf16", "amx_int8", "asimddp", "i8mm", "bf16")
    return {"cpu": model or platform.processor() or platform.machine(),
            "machine": platform.machine(), "cores": os.cpu_count(),
            "features": [k for k in keys if k in feats]}


def host_line(host: dict) -> str:
    """`host_description` as the tools print it."""
    return f"host: {host['cpu']} ({host['cores']} cores; {' '.join(host['features'])})"


def _variants(args) -> list[tuple[str, str, str]]:
    """(runner name, dispatch, precision) of each tvmopt build."""
    precisions = args.precision.split(",")
    out = []
    for mode in args.dispatch.split(","):
        for prec in precisions:
            name = f"tvmopt-{mode}" + (f"-{prec}" if len(precisions) > 1 else "")
            out.append((name, mode, prec))
    return out


def _tuned_spec(args, row, path, out) -> dict:
    """`tvmopt tune PATH --minutes N` into a fresh database, then the build compiled from it,
    as a user does it: the first --dispatch and --precision, no other option. What the run
    spent and why it stopped go into the row."""
    import shutil

    import tvmopt
    from tvmopt.bench.isolated import Spec
    from tvmopt.interface.tune import tune
    from tvmopt.tuning.tune import TuneOptions, ceiling

    _, mode, prec = _variants(args)[0]
    db = out / "dbs" / Path(path).stem
    shutil.rmtree(db, ignore_errors=True)  # the budget is this run's, not an old database's
    t0 = time.perf_counter()
    res = tune(TuneOptions(model=path, target=args.target, minutes=args.tune_minutes,
                           db=str(db), dispatch=mode, precision=prec))
    floor = ceiling(res.library, res.default_estimate_s)
    row["tuning"] = {
        "minutes": args.tune_minutes, "wall_s": round(time.perf_counter() - t0, 1),
        "tasks": len(res.tasks), "trials": res.trials_run, "stopped_by": res.stopped_by,
        "spent": None if res.spent is None else round(res.spent, 3),
        "build_failures": res.build_failures, "run_failures": res.run_failures,
        "estimate_ms": None if res.estimate_s is None else round(res.estimate_s * 1e3, 3),
        "default_estimate_ms": (None if res.default_estimate_s is None
                                else round(res.default_estimate_s * 1e3, 3)),
        # what oneDNN runs, untouched by tuning, and the floor that puts on tuned / untuned
        "library_ms": (None if res.library is None or res.library.untimed
                       else round(res.library.ms, 3)),
        "floor": None if floor is None else round(floor[1], 3),
        # how near those calls run to oneDNN's best on this host (tuning.library.probe_rates)
        "library_gflops": (None if res.library is None or res.library.gflops is None
                           else round(res.library.gflops, 1)),
        "library_of_probe": (None if res.library is None or res.library.of_probe is None
                             else round(res.library.of_probe, 3)),
        "probe_gflops": None if res.library is None else res.library.probe,
        # cores other processes kept busy while tune measured (its figures mean little then)
        "foreign_load": res.foreign_load}
    print(f"  tuned {Path(path).name}: {row['tuning']}")
    t0 = time.perf_counter()
    built = tvmopt.compile_model(tvmopt.CompileOptions(
        model=path, target=args.target, dispatch=mode, precision=prec, db=str(db),
        output=str(out / "artifacts" / f"{Path(path).stem}_{mode}_{prec}_tuned")),
        log=lambda s: None)
    row["compile_s"]["tuned"] = round(time.perf_counter() - t0, 1)
    # the tasks the tuned build found in its database (a miss runs its default schedule)
    row["tuning"]["hit_rate"] = built.replay.hit_rate if built.replay is not None else None
    return {"tvmopt-tuned": Spec("tvmopt", str(built.artifact.path))}


def _baseline_specs(args, path, source, name, batch) -> dict:
    from importlib.util import find_spec

    from tvmopt.bench.isolated import Spec

    wanted = [b for b in args.baselines.split(",") if b]
    bad = [b for b in wanted if b not in BASELINES]
    if bad:
        raise SystemExit(f"--baselines: unknown {bad} (choose from {', '.join(BASELINES)})")
    specs = {"onnxruntime": Spec("onnxruntime", path)}
    if find_spec("openvino") is not None:
        if "openvino" in wanted:
            specs["openvino"] = Spec("openvino", path)
        if "openvino-f32" in wanted:
            specs["openvino-f32"] = Spec("openvino", path, precision="f32")
    elif any(b.startswith("openvino") for b in wanted):
        print("openvino not installed: its baselines are skipped (pip install 'tvmopt[baselines]')")
    if "torch" in wanted:
        specs["torch"] = Spec("torch", builder=f"{source.__name__}:build", builder_args=(name,),
                              sys_path=(str(HERE),))
    return specs


def quantized(path: str, kind: str, feed: dict) -> str:
    """onnxruntime's quantization of the model at `path`: 'static' (QDQ, per-channel weights,
    u8 activations calibrated on seeded inputs shaped like `feed`) or 'dynamic' (int8 weights,
    activations quantized at run time). Cached by file name."""
    import logging

    import numpy as np
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)

    out = str(Path(path).with_name(f"{Path(path).stem}_{kind}_int8.onnx"))
    if Path(out).exists():
        return out
    logging.getLogger().setLevel(logging.ERROR)
    if kind == "dynamic":
        quantize_dynamic(path, out, weight_type=QuantType.QInt8)
        return out
    if kind != "static":
        raise SystemExit(f"--int8: unknown '{kind}' (choose static, dynamic)")

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(1)
            self.it = iter([{k: (rng.standard_normal(v.shape).astype(v.dtype)
                                 if v.dtype.kind == "f" else v) for k, v in feed.items()}
                            for _ in range(8)])

        def get_next(self):
            return next(self.it, None)

    quantize_static(path, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out


def _compile_row(args, row, path, out):
    """Compile every tvmopt variant of `path` (while no worker runs: compile times kernels)."""
    import tvmopt
    from tvmopt.bench.isolated import Spec

    specs = {}
    for runner, mode, prec in _variants(args):
        t0 = time.perf_counter()
        res = tvmopt.compile_model(tvmopt.CompileOptions(
            model=path, target=args.target, dispatch=mode, precision=prec,
            output=str(out / "artifacts" / f"{Path(path).stem}_{mode}_{prec}")),
            log=lambda s: None)
        key = runner[len("tvmopt-"):]
        row["compile_s"][key] = round(time.perf_counter() - t0, 1)
        choices = res.artifact.manifest["kernels"]["choices"]
        row.setdefault("library_sites", {})[key] = sum(
            c["sites"] for c in choices if c["choice"] == "library")
        specs[runner] = Spec("tvmopt", str(res.artifact.path))
    return specs


def _measure_row(args, row, specs, feed) -> dict:
    """One worker per runtime; outputs checked against onnxruntime; interleaved timing."""
    import numpy as np

    import tvmopt
    from tvmopt.bench.isolated import Worker, interleaved
    from tvmopt.interface.gate import relative_error

    workers = {}
    try:
        for k, spec in specs.items():
            try:
                workers[k] = Worker(k, spec, args.threads, feed)
            except tvmopt.TvmoptError as err:
                print(f"  {k}: skipped ({err})")
        # Same answers first: a fast wrong kernel is not a result. The error is
        # max |out - onnxruntime| / max |onnxruntime| (what the accuracy gate uses).
        ref0 = next(iter(workers["onnxruntime"].outputs().values()))
        for k, w in workers.items():
            got = next(iter(w.outputs().values()))
            row.setdefault("rel_err", {})[k] = relative_error({"o": got}, {"o": ref0})[0]
            if "precision" in w.info:
                row["precision"][k] = w.info["precision"]
        times = interleaved(workers, args.runs, args.block)
    finally:
        for w in workers.values():
            w.close()
    ort_p50 = float(np.median(times["onnxruntime"]))
    for k, t in times.items():
        p50, p95 = float(np.median(t)), float(np.percentile(t, 95))
        row["ms"][k] = {"p50": round(p50, 3), "p95": round(p95, 3),
                        "ratio_to_ort": round(p50 / ort_p50, 3)}
    print(f"{row['model']:15s} b{row['batch']:<2d} " + "  ".join(
        f"{k} {v['p50']:8.2f} ms ({v['ratio_to_ort']:.2f}x, err {row['rel_err'][k]:.1e})"
        for k, v in row["ms"].items())
        + "  compile " + ", ".join(f"{m} {s}s" for m, s in row["compile_s"].items()), flush=True)
    return row


def _dynamic_rows(args, full_name, out) -> list[dict]:
    """One artifact of the dynamic export, timed at every (batch, seq), beside the static
    export's build at that shape and the baselines on the dynamic file."""
    import torch_models

    import tvmopt
    from tvmopt.bench.isolated import Spec

    name = full_name[len("dyn:"):]
    batches = [int(b) for b in args.batches.split(",")]
    # A model without a sequence dim (a CNN) varies its batch only.
    has_seq = name in torch_models.SEQUENCE_MODELS
    seqs = [int(s) for s in args.seqs.split(",")] if has_seq else [None]
    path = torch_models.export_dynamic(name, str(out / "models"))
    template = {"compile_s": {}, "ms": {}, "precision": {}}
    dims = {"batch": (1, max(batches))}
    if has_seq:
        dims["seq"] = (1, max(seqs))
    built = {}
    for runner, mode, prec in _variants(args):
        t0 = time.perf_counter()
        res = tvmopt.compile_model(tvmopt.CompileOptions(
            model=path, target=args.target, dispatch=mode, precision=prec, dim_bounds=dims,
            output=str(out / "artifacts" / f"{name}_dynamic_{mode}_{prec}")), log=lambda s: None)
        template["compile_s"][runner[len("tvmopt-"):]] = round(time.perf_counter() - t0, 1)
        built[runner] = Spec("tvmopt", str(res.artifact.path))
    _, mode, prec = _variants(args)[-1]
    rows = []
    for batch in batches:
        for seq in seqs:
            static = (torch_models.export_at(name, str(out / "models"), batch, seq) if has_seq
                      else torch_models.export(name, str(out / "models"), batch))
            res = tvmopt.compile_model(tvmopt.CompileOptions(
                model=static, target=args.target, dispatch=mode, precision=prec,
                output=str(out / "artifacts" / f"{Path(static).stem}_{mode}_{prec}")),
                log=lambda s: None)
            row = {**json.loads(json.dumps(template)),
                   "model": f"{full_name} seq={seq}" if has_seq else full_name, "batch": batch}
            specs = {**built, "tvmopt-static": Spec("tvmopt", str(res.artifact.path)),
                     **_baseline_specs(args, path, torch_models, name, batch)}
            specs.pop("torch", None)  # eager PyTorch has no export to vary: its rows are static
            x = (torch_models.example_at(name, batch, seq) if has_seq
                 else torch_models.example(name, batch))
            rows.append(_measure_row(args, row, specs, {"input": x.numpy()}))
    return rows


def main(argv=None) -> int:
    sys.path.insert(0, str(HERE))
    args = _args(argv)
    if args.markdown_from:
        print(markdown(json.loads(Path(args.markdown_from).read_text())))
        return 0
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))  # before TVM loads

    import numpy as np

    from tvmopt.bench.isolated import Spec

    host = host_description()
    print(f"{host_line(host)}; {args.threads} threads per runtime, each in its own process")
    out = Path(args.out)
    rows = []
    kinds = [k for k in args.int8.split(",") if k]
    for full_name in args.models.split(","):
        if full_name.startswith("dyn:"):
            rows += _dynamic_rows(args, full_name, out)
            continue
        source, name = _source(full_name)
        for batch in [int(b) for b in args.batches.split(",")]:
            original = source.export(name, str(out / "models"), batch)
            feed = {"input": source.example(name, batch).numpy()}
            row = {"model": full_name, "batch": batch, "compile_s": {}, "ms": {},
                   "precision": {}}
            specs = _compile_row(args, row, original, out)
            if args.tune_minutes:
                specs.update(_tuned_spec(args, row, original, out))
            # the int8 rows' reference build of the original: fp32 if it was built, else the first
            ref_name, _, ref_prec = next((v for v in _variants(args) if v[2] == "fp32"),
                                         _variants(args)[0])
            original_build = specs[ref_name].path
            specs.update(_baseline_specs(args, original, source, name, batch))
            rows.append(_measure_row(args, row, specs, feed))
            for kind in kinds:
                # The int8 file against the baselines on the same file, beside what the user
                # had before quantizing: tvmopt's (first) build of the fp32 original.
                path = quantized(original, kind, feed)
                row = {"model": f"{full_name} ({kind} int8)", "batch": batch, "compile_s": {},
                       "ms": {}, "precision": {}}
                specs = _compile_row(args, row, path, out)
                specs[f"tvmopt-original-{ref_prec}"] = Spec("tvmopt", original_build)
                specs.update(_baseline_specs(args, path, source, name, batch))
                specs.pop("torch", None)  # the same eager fp32 module as the original's row
                rows.append(_measure_row(args, row, specs, feed))

    print("\nmodel, batch: runtime P50 / P95 ms (x onnxruntime)")
    for r in rows:
        print(f"{r['model']:16s} {r['batch']:5d} | " + " | ".join(
            f"{k} {v['p50']:.2f} / {v['p95']:.2f} ({v['ratio_to_ort']:.2f}x)"
            for k, v in r["ms"].items())
            + " | compile " + ", ".join(f"{m} {s}" for m, s in r["compile_s"].items()))
    untuned = _variants(args)[0][0]
    for r in rows:
        if "tvmopt-tuned" in r["ms"] and untuned in r["ms"]:
            r["tuned_vs_untuned"] = round(r["ms"]["tvmopt-tuned"]["p50"]
                                          / r["ms"][untuned]["p50"], 3)
            t = r["tuning"]
            print(f"{r['model']} b{r['batch']}: tuned / untuned ({untuned}) "
                  f"{r['tuned_vs_untuned']:.2f}x; {t['trials']} trials on {t['tasks']} tasks "
                  f"in {t['wall_s']:.0f} s, stopped by {t['stopped_by']}"
                  + (f"; oneDNN {t['library_ms']:.3g} ms untouched: floor {t['floor']:.2f}x"
                     if t.get("floor") is not None else "")
                  + (f", its calls at {t['library_of_probe']:.0%} of its large-matmul rate"
                     if t.get("library_of_probe") is not None else ""))
    summary = summarize(rows)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({
            "threads": args.threads, "host": host, "isolation": "one process per runtime",
            "tvm_num_threads": os.environ.get("TVM_NUM_THREADS"), "rows": rows,
            "summary": summary, "command": " ".join(sys.argv)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
