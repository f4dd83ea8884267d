#!/usr/bin/env python3
"""Latency of the bundled models: tvmopt untuned, tvmopt from the committed database,
onnxruntime (threads = cores) and PyTorch eager, in one run on one machine.

    python tools/bench_tuning.py                      # every bundled model, 200 runs each
    python tools/bench_tuning.py --models resnet_cnn --runs 100
    python tools/bench_tuning.py --efficiency-db /tmp/full_db --efficiency-model resnet_cnn
    python tools/bench_tuning.py --models "" --efficiency-db /tmp/r18-db \\
        --efficiency-model /tmp/large/resnet18.onnx --efficiency-shape input=1x3x224x224

Prints median and P95 latency (ms) and each median's ratio to onnxruntime. With
--efficiency-db (an unpruned database, records in measurement order) it also compiles the
model from the first 10/25/50/100% of the records and times each: the tuning efficiency.
All runtimes get the same random inputs at batch 1; outputs are checked against onnxruntime.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# Equal thread counts: onnxruntime and torch run with threads = cores, so TVM's pool gets the same
# (its default is half the logical cores). Set before TVM starts its pool.
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))

ROOT = Path(__file__).resolve().parent.parent
# Batch 1, the shapes the committed databases were tuned at (see their tvmopt-db.json).
SHAPES = {"mobile_cnn": {"input": (1, 3, 96, 96)}, "resnet_cnn": {"input": (1, 3, 96, 96)},
          "tiny_bert": {"input_ids": (1, 32)}}
TARGET = "x86"


def _time(fn, runs: int, warmup: int = 10) -> np.ndarray:
    for _ in range(warmup):
        fn()
    out = np.empty(runs)
    for i in range(runs):
        t = time.perf_counter()
        fn()
        out[i] = time.perf_counter() - t
    return out * 1e3


def _stats(ms: np.ndarray) -> dict:
    return {"median_ms": float(np.median(ms)), "p95_ms": float(np.percentile(ms, 95))}


def _feeds(name: str) -> dict:
    rng = np.random.default_rng(0)
    if name == "tiny_bert":
        return {"input_ids": rng.integers(0, 1000, SHAPES[name]["input_ids"]).astype("int64")}
    return {k: rng.standard_normal(s).astype("float32") for k, s in SHAPES[name].items()}


def _compile(model: Path, name: str, out: Path, db: Path | None):
    from tvmopt.interface.compile import CompileOptions, compile_model

    opts = CompileOptions(model=str(model), target=TARGET, output=str(out),
                          shapes={k: v for k, v in SHAPES[name].items()},
                          db=str(db) if db else None, require_db=db is not None)
    return compile_model(opts, log=lambda *a: None)


def _tvm_fn(artifact: Path, feeds: dict):
    from tvmopt.runtime.loader import load

    lm = load(artifact)
    args = lm.to_device(feeds)
    return (lambda: lm.run_device(args)), (lambda: lm.run(feeds))


def _torch_module(name: str):
    """Rebuild the torch module exactly as tools/make_models.py built the ONNX file."""
    import torch

    spec = importlib.util.spec_from_file_location("make_models", ROOT / "tools" / "make_models.py")
    mm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mm)
    torch.manual_seed(0)
    cls = {"mobile_cnn": mm.MobileCNN, "resnet_cnn": mm.ResNetCNN, "tiny_bert": mm.TinyBert}[name]
    module = cls()
    if name != "tiny_bert":
        mm._init(module)
    return module.eval()


def bench_model(name: str, model: Path, runs: int, workdir: Path) -> list[dict]:
    import torch

    from tvmopt.tuning.database import bundled_db_dir
    from tvmopt.runtime.verify import ort_session

    feeds = _feeds(name)
    cores = os.cpu_count() or 1
    sess = ort_session(str(model), threads=cores)
    ref = sess.run(None, feeds)[0]
    rows = []

    def add(runtime: str, fn, check, note: str = ""):
        err = float(np.max(np.abs(check() - ref)))
        rows.append({"model": name, "runtime": runtime, **_stats(_time(fn, runs)),
                     "max_abs_err_vs_ort": err, "note": note})

    for label, db in (("tvmopt untuned", None), ("tvmopt tuned (db)", bundled_db_dir(name, "x86-avx2"))):
        if db is not None and not (db / "database_tuning_record.json").exists():
            rows.append({"model": name, "runtime": label, "note": f"no committed database at {db}"})
            continue
        try:
            res = _compile(model, name, workdir / f"{name}-{'db' if db else 'plain'}", db)
        except Exception as err:  # report and go on with the other runtimes
            rows.append({"model": name, "runtime": label,
                         "note": "compile failed: " + str(err).split(":")[0][:70]})
            continue
        fn, run = _tvm_fn(res.artifact.path, feeds)
        note = f"hit rate {res.replay.hit_rate:.0%}" if res.replay is not None else ""
        add(label, fn, lambda: list(run().values())[0], note)

    add("onnxruntime", lambda: sess.run(None, feeds), lambda: sess.run(None, feeds)[0],
        f"{cores} threads")
    torch.set_num_threads(cores)
    module = _torch_module(name)
    tfeeds = [torch.from_numpy(v) for v in feeds.values()]
    with torch.inference_mode():
        add("pytorch eager", lambda: module(*tfeeds), lambda: module(*tfeeds).numpy(),
            f"{cores} threads")
    ort = next(r["median_ms"] for r in rows if r["runtime"] == "onnxruntime")
    for r in rows:
        if "median_ms" in r:
            r["ratio_to_ort"] = r["median_ms"] / ort
    return rows


def _model_feeds(model: Path, shapes: dict) -> dict:
    """Random inputs for any ONNX file at `shapes` (integer inputs small: valid token ids)."""
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.frontend.onnx_model import load_onnx
    from tvmopt.runtime.loader import random_inputs

    return random_inputs(import_onnx(load_onnx(str(model)), shapes).inputs)


def efficiency(name: str, model: Path, full_db: Path, runs: int, workdir: Path,
               shapes: dict | None = None) -> list[dict]:
    """Latency after the first 10/25/50/100% of the records (in measurement order).

    `name` is a bundled model, or any label with `shapes` given (e.g. tools/make_large_models.py's
    ResNet-18); the last row is onnxruntime on the same inputs, threads = cores.
    """
    from tvmopt.tuning.database import MANIFEST_FILE, RECORD_FILE, WORKLOAD_FILE
    from tvmopt.runtime.verify import ort_session

    shapes = shapes or SHAPES[name]
    records = (full_db / RECORD_FILE).read_text().splitlines()
    feeds = _feeds(name) if name in SHAPES else _model_feeds(model, shapes)
    sess = ort_session(str(model), threads=os.cpu_count() or 1)
    ref = sess.run(None, feeds)[0]
    rows = []
    for pct in (10, 25, 50, 100):
        n = max(1, len(records) * pct // 100)
        part = workdir / f"eff-{pct}"
        part.mkdir(parents=True, exist_ok=True)
        (part / WORKLOAD_FILE).write_text((full_db / WORKLOAD_FILE).read_text())
        (part / RECORD_FILE).write_text("\n".join(records[:n]) + "\n")
        if (full_db / MANIFEST_FILE).exists():
            (part / MANIFEST_FILE).write_text((full_db / MANIFEST_FILE).read_text())
        from tvmopt.interface.compile import CompileOptions, compile_model

        res = compile_model(CompileOptions(model=str(model), target=TARGET,
                                           output=str(workdir / f"eff-{pct}.tvmopt"),
                                           shapes=shapes, db=str(part)), log=lambda *a: None)
        fn, run = _tvm_fn(res.artifact.path, feeds)
        err = float(np.max(np.abs(list(run().values())[0] - ref)))
        rows.append({"percent": pct, "trials": n, "hit_rate": res.replay.hit_rate,
                     **_stats(_time(fn, runs)), "max_abs_err_vs_ort": err})
    rows.append({"percent": "onnxruntime", "trials": "-", "hit_rate": None,
                 **_stats(_time(lambda: sess.run(None, feeds), runs)), "max_abs_err_vs_ort": 0.0})
    return rows


def main(argv=None) -> int:
    from rich.console import Console
    from rich.table import Table

    from tvmopt.models import bundled

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(SHAPES))
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--efficiency-db", type=Path)
    ap.add_argument("--efficiency-model", default="resnet_cnn",
                    help="A bundled model, or an .onnx path (then give --efficiency-shape).")
    ap.add_argument("--efficiency-shape", action="append", default=[], metavar="NAME=1x3x224x224")
    ap.add_argument("--json", type=Path, help="Also write the rows here.")
    args = ap.parse_args(argv)
    console = Console(width=130)
    models = bundled()
    all_rows, eff = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in filter(None, args.models.split(",")):
            all_rows += bench_model(name, models[name], args.runs, Path(tmp))
        if args.efficiency_db:
            from tvmopt.frontend.onnx_model import parse_shape_spec

            em = args.efficiency_model
            path = models[em] if em in models else Path(em)
            shapes = dict(parse_shape_spec(x) for x in args.efficiency_shape) or None
            eff = efficiency(em if em in models else path.stem, path, args.efficiency_db,
                             args.runs, Path(tmp), shapes)
    table = Table(title=f"batch 1, {os.cpu_count()} cores, {args.runs} runs each, TVM_NUM_THREADS="
                        f"{os.environ['TVM_NUM_THREADS']}")
    for col in ("model", "runtime", "median ms", "P95 ms", "x ORT", "max |err| vs ORT", "note"):
        table.add_column(col, justify="left" if col in ("model", "runtime", "note") else "right")
    for r in all_rows:
        has = "median_ms" in r
        table.add_row(r["model"], r["runtime"], f"{r['median_ms']:.3f}" if has else "-",
                      f"{r['p95_ms']:.3f}" if has else "-",
                      f"{r['ratio_to_ort']:.2f}" if has else "-",
                      f"{r['max_abs_err_vs_ort']:.1e}" if has else "-", r.get("note", ""))
    console.print(table)
    if eff:
        t2 = Table(title=f"tuning efficiency: {args.efficiency_model} from {args.efficiency_db}")
        ort = eff[-1]["median_ms"]
        for col in ("% of trials", "trials", "hit rate", "median ms", "P95 ms", "x ORT", "max |err|"):
            t2.add_column(col, justify="right")
        for r in eff:
            t2.add_row(str(r["percent"]), str(r["trials"]),
                       "-" if r["hit_rate"] is None else f"{r['hit_rate']:.0%}",
                       f"{r['median_ms']:.3f}", f"{r['p95_ms']:.3f}", f"{r['median_ms'] / ort:.2f}",
                       f"{r['max_abs_err_vs_ort']:.1e}")
        console.print(t2)
    if args.json:
        args.json.write_text(json.dumps({"rows": all_rows, "efficiency": eff}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
