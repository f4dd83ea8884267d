#!/usr/bin/env python3
"""What the run-time checks on request values cost (docs/reliability.md).

    python tools/bench_checks.py                       # bert4l and gpt2_4l, batch 1, seq 128
    python tools/bench_checks.py --models bert4l --seq 32,128 --runs 30
    ONEDNN_MAX_CPU_ISA=AVX2 python tools/bench_checks.py --target x86-avx2

Each model is exported as users export it (tools/torch_models.py: symbolic batch and sequence),
compiled through `compile_model` as `tvmopt compile` does, loaded and run through `run()`. The
checks are kernels of their own (frontend/run_time_checks.py: `index_check`, `size_check`), so
their cost is read from the per-kernel profile of real runs (bench/profile.py, the same hook as
`tvmopt bench --profile-top`): their time per run against the whole call's. The hook adds a
Python round trip to every kernel call, so the checks' share comes out high, never low.
Then the artifact (checks included) and onnxruntime are timed on the same inputs, each in a
worker process of its own, in rounds of alternating order with equal threads
(bench/isolated.py), and the checks' time is also given against onnxruntime's latency.
Prints one row per model and size, and writes --json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CHECK_KERNELS = ("index_check", "size_check")


def measure(model_path: str, seq: int, runs: int, out_dir: str, target: str) -> dict:
    import numpy as np

    from tvmopt.bench.profile import kernel_profile
    from tvmopt.interface.compile import CompileOptions, compile_model
    from tvmopt.runtime.loader import load, random_inputs

    res = compile_model(CompileOptions(model=model_path, target=target,
                                       output=os.path.join(out_dir, Path(model_path).stem)),
                        log=lambda *a: None)
    lm = load(res.artifact.path)
    dims = {d: (1 if k == 0 else seq) for i in lm.inputs for k, d in enumerate(i.shape or ())
            if isinstance(d, str)}
    feeds = random_inputs(lm.inputs, dims)
    args = lm.to_device(feeds)
    lm.run(feeds)
    prof = kernel_profile(lm, args, runs=runs, top=100_000)
    checks = [k for k in prof["kernels"] if any(c in k["name"] for c in CHECK_KERNELS)]
    check_ms = sum(k["total_ms_per_run"] for k in checks)
    del lm, args

    from tvmopt.bench.isolated import Spec, Worker, interleaved

    threads = int(os.environ["TVM_NUM_THREADS"])
    workers = {}
    try:
        workers["tvmopt"] = Worker("tvmopt", Spec("tvmopt", str(res.artifact.path)), threads,
                                   feeds)
        workers["onnxruntime"] = Worker("onnxruntime", Spec("onnxruntime", model_path),
                                        threads, feeds)
        times = interleaved(workers, runs)
    finally:
        for w in workers.values():
            w.close()
    tvm_ms, ort_ms = (float(np.median(times[k])) for k in ("tvmopt", "onnxruntime"))
    return {"seq": seq, "threads": threads, "profiled_ms_per_run": prof["total_ms_per_run"],
            "check_ms_per_run": check_ms, "check_calls_per_run": sum(k["calls_per_run"]
                                                                     for k in checks),
            "share": check_ms / prof["total_ms_per_run"] if prof["total_ms_per_run"] else 0.0,
            "tvmopt_ms": tvm_ms, "onnxruntime_ms": ort_ms, "tvmopt_over_onnxruntime":
                tvm_ms / ort_ms, "checks_over_onnxruntime": check_ms / ort_ms,
            "checks_listed": res.artifact.manifest["run_time_checks"]["checks"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="bert4l,gpt2_4l")
    ap.add_argument("--seq", default="128")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--target", default="host",
                    help="x86-avx2 with ONEDNN_MAX_CPU_ISA=AVX2 emulates that class on an "
                         "AVX-512 host (onnxruntime still uses AVX-512 there)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch_models
    from bench_default import host_description, host_line

    host = host_description()
    host["target"] = args.target
    host["onednn_max_cpu_isa"] = os.environ.get("ONEDNN_MAX_CPU_ISA")
    print(host_line(host), f"target {args.target}",
          f"ONEDNN_MAX_CPU_ISA={host['onednn_max_cpu_isa']}" if host["onednn_max_cpu_isa"] else "")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = torch_models.export_dynamic(name, tmp)
            for seq in (int(s) for s in args.seq.split(",")):
                r = {"model": name, **measure(path, seq, args.runs, tmp, args.target)}
                rows.append(r)
                print(f"{name} seq {seq}: {r['check_calls_per_run']:g} check kernels, "
                      f"{r['check_ms_per_run'] * 1e3:.1f} us per run ({r['share']:.2%} of the "
                      f"profiled call, {r['checks_over_onnxruntime']:.2%} of onnxruntime's "
                      f"{r['onnxruntime_ms']:.2f} ms); tvmopt {r['tvmopt_ms']:.2f} ms = "
                      f"{r['tvmopt_over_onnxruntime']:.2f}x onnxruntime")
    if args.json:
        Path(args.json).write_text(json.dumps({"host": host, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
