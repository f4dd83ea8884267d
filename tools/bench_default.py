"""Untuned speed: tvmopt with no database against onnxruntime and PyTorch, same run, same threads.

Builds ResNet-18, MobileNetV2, a 4-layer BERT encoder and a 4-layer GPT-2 decoder (hidden 256,
seq 128), plus a ConvNeXt-style CNN and a wide MLP (`tools/torch_models.py`, random weights,
fixed seeds), exported with torch.onnx.export at opset 17 at each batch size; compiles each with
`--dispatch codegen` (the default schedules) and `--dispatch auto` (oneDNN per kernel where it
times faster), no tuning database; then times tvmopt (both), onnxruntime (CPU provider) and
PyTorch eager interleaved in blocks, every runtime on the same number of threads, and prints
medians, P95, ratios to onnxruntime, the geometric means and the compile times.

`--models hf:resnet50,hf:vit_small,...` takes published architectures from `transformers`
instead (tools/hf_models.py: upstream implementations, random weights): models this project's
rules were not written against.

Usage:
  python tools/bench_default.py [--models resnet18,bert4l,hf:resnet50] [--batches 1,8]
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
GAP_S = 0.2  # idle time before each block: the previous runtime's spinning threads wind down


def _args(argv):
    import torch_models

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(torch_models.MODELS),
                    help="names from tools/torch_models.py, or hf:NAME from tools/hf_models.py")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--runs", type=int, default=20, help="timed calls per runtime and row")
    ap.add_argument("--block", type=int, default=5, help="calls per runtime before switching")
    ap.add_argument("--dispatch", default="codegen,auto")
    ap.add_argument("--target", default="host",
                    help="tvmopt target; 'host' uses this CPU's vector width, as onnxruntime and "
                         "PyTorch do at run time ('x86' is the portable AVX2 build)")
    ap.add_argument("--out", default="tvmopt-out/bench-default", help="models and artifacts")
    ap.add_argument("--json", dest="json_path", default=None)
    ap.add_argument("--markdown-from", default=None, metavar="JSON",
                    help="print the Markdown tables of a results file written by --json, "
                         "measuring nothing (what docs/performance.md shows)")
    return ap.parse_args(argv)


def _geomean(ratios) -> float:
    import numpy as np

    return float(np.exp(np.log(np.asarray(ratios, dtype=float)).mean()))


def markdown(results: dict) -> str:
    """The rows of a --json results file as a Markdown table, then the geometric means."""
    rows = results["rows"]
    runners = list(rows[0]["ms"])
    modes = [r[len("tvmopt-"):] for r in runners if r.startswith("tvmopt-")]
    others = [r for r in runners if not r.startswith("tvmopt-") and r != "onnxruntime"]
    head = (["model", "batch"] + [f"tvmopt {m} P50 (x ort)" for m in modes]
            + ["onnxruntime P50"] + [f"{o} P50 (x ort)" for o in others]
            + ["compile " + " / ".join(modes)])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cell = {k: f"{v['p50']:.2f} ms ({v['ratio_to_ort']:.2f}x)" for k, v in r["ms"].items()}
        out.append("| " + " | ".join(
            [r["model"], str(r["batch"])] + [cell[f"tvmopt-{m}"] for m in modes]
            + [f"{r['ms']['onnxruntime']['p50']:.2f} ms"] + [cell[o] for o in others]
            + [" / ".join(f"{r['compile_s'][m]:.1f} s" for m in modes)]) + " |")
    out += ["", "| rows | " + " | ".join(modes + others) + " |",
            "|---|" + "---|" * (len(modes) + len(others))]
    ratio = {k: [r["ms"][k]["ratio_to_ort"] for r in rows] for k in runners}
    out.append(f"| {len(rows)} rows, geometric mean (worst) | " + " | ".join(
        f"{_geomean(ratio[k]):.2f}x ({max(ratio[k]):.2f}x)"
        for k in [f"tvmopt-{m}" for m in modes] + others) + " |")
    return "\n".join(out)


def _interleaved(runners: dict, runs: int, block: int) -> dict[str, list[float]]:
    """ms per call for each runner, alternating blocks of `block` calls; the first call of
    each block is dropped, and each block starts after an idle gap: onnxruntime's and OpenMP's
    pools keep spinning after a call and slow whichever runtime runs next on 2 cores (measured:
    a mixed oneDNN/TVM model 2x slower for tens of ms after an onnxruntime run)."""
    import numpy as np

    times = {k: [] for k in runners}
    for f in runners.values():  # warm-up: first-call costs (oneDNN weight reorders) excluded
        f()
        f()
    while min(len(v) for v in times.values()) < runs:
        for name, f in runners.items():
            time.sleep(GAP_S)
            for i in range(block + 1):
                t0 = time.perf_counter()
                f()
                if i:
                    times[name].append((time.perf_counter() - t0) * 1e3)
    return {k: np.asarray(v[:runs]) for k, v in times.items()}


def _source(name: str):
    """(module that builds and exports it, its name there)."""
    if name.startswith("hf:"):
        import hf_models

        return hf_models, name[3:]
    import torch_models

    return torch_models, name


def main(argv=None) -> int:
    sys.path.insert(0, str(HERE))
    args = _args(argv)
    if args.markdown_from:
        print(markdown(json.loads(Path(args.markdown_from).read_text())))
        return 0
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))  # before TVM loads

    import numpy as np
    import onnxruntime as ort
    import torch

    import tvmopt

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    rows = []
    for full_name in args.models.split(","):
        source, name = _source(full_name)
        for batch in [int(b) for b in args.batches.split(",")]:
            path = source.export(name, str(out / "models"), batch)
            x = source.example(name, batch)
            feed = {"input": x.numpy()}
            row = {"model": full_name, "batch": batch, "compile_s": {}, "ms": {}}
            runners = {}
            for mode in args.dispatch.split(","):
                t0 = time.perf_counter()
                res = tvmopt.compile_model(tvmopt.CompileOptions(
                    model=path, target=args.target, dispatch=mode,
                    output=str(out / "artifacts" / f"{name}_b{batch}_{mode}")),
                    log=lambda s: None)
                row["compile_s"][mode] = round(time.perf_counter() - t0, 1)
                kernels = res.artifact.manifest["kernels"]
                row.setdefault("library_sites", {})[mode] = sum(
                    c["sites"] for c in kernels["choices"] if c["choice"] == "library")
                lm = tvmopt.load(res.artifact.path)
                runners[f"tvmopt-{mode}"] = (lambda lm=lm: lm.run(feed))
            so = ort.SessionOptions()
            so.intra_op_num_threads = args.threads
            so.inter_op_num_threads = 1
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            runners["onnxruntime"] = lambda: sess.run(None, feed)
            model = source.build(name)

            def eager(model=model, x=x):
                with torch.inference_mode():
                    return model(x)

            runners["torch"] = eager
            # Same answers first: a fast wrong kernel is not a result.
            ref = sess.run(None, feed)[0]
            for k, f in runners.items():
                if k.startswith("tvmopt"):
                    got = list(f().values())[0]
                    err = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-12))
                    row.setdefault("rel_err", {})[k] = err
            times = _interleaved(runners, args.runs, args.block)
            ort_p50 = float(np.median(times["onnxruntime"]))
            for k, t in times.items():
                p50, p95 = float(np.median(t)), float(np.percentile(t, 95))
                row["ms"][k] = {"p50": round(p50, 3), "p95": round(p95, 3),
                                "ratio_to_ort": round(p50 / ort_p50, 3)}
            rows.append(row)
            print(f"{name:15s} b{batch:<2d} " + "  ".join(
                f"{k} {v['p50']:8.2f} ms ({v['ratio_to_ort']:.2f}x)" for k, v in row["ms"].items())
                + "  compile " + ", ".join(f"{m} {s}s" for m, s in row["compile_s"].items()),
                flush=True)

    print("\nmodel            batch | " + " | ".join(
        f"{k} P50 / P95 ms (x ort)" for k in rows[0]["ms"]) + " | compile s")
    for r in rows:
        print(f"{r['model']:16s} {r['batch']:5d} | " + " | ".join(
            f"{v['p50']:.2f} / {v['p95']:.2f} ({v['ratio_to_ort']:.2f}x)" for v in r["ms"].values())
            + " | " + ", ".join(f"{m} {s}" for m, s in r["compile_s"].items()))
    summary = {}
    for k in rows[0]["ms"]:
        ratios = np.array([r["ms"][k]["ratio_to_ort"] for r in rows])
        summary[k] = {"geomean_ratio": round(_geomean(ratios), 3),
                      "worst_ratio": round(float(ratios.max()), 3)}
        print(f"geomean ratio to onnxruntime, {k}: {summary[k]['geomean_ratio']:.2f}x "
              f"(worst {summary[k]['worst_ratio']:.2f}x)")
    if args.json_path:
        import platform

        Path(args.json_path).write_text(json.dumps({
            "threads": args.threads, "host": platform.processor() or platform.machine(),
            "tvm_num_threads": os.environ.get("TVM_NUM_THREADS"), "rows": rows,
            "summary": summary, "command": " ".join(sys.argv)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
