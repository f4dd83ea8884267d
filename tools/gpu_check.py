"""Run a CUDA artifact on a real GPU against onnxruntime and PyTorch (one short prepared check).

Usage on a machine with an NVIDIA GPU, tvmopt installed and the model at hand:

    python tools/gpu_check.py ARTIFACT MODEL.onnx [--dim batch=1] [--atol 2e-2] [--rtol 2e-2]

It loads ARTIFACT (a `tvmopt compile --target cuda|h100|h200` folder) on cuda:0, runs it on seeded
random inputs, runs MODEL.onnx with onnxruntime (CPU, fp32) as the reference and, when PyTorch sees
the GPU, repeats the comparison on the device with torch.allclose. Prints one JSON line with the max/mean errors and the GPU name; exit 1 past tolerance.
Tolerances default to fp16's: mixed-precision builds differ from fp32 references by ~1e-3 relative.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact")
    ap.add_argument("model")
    ap.add_argument("--dim", action="append", default=[], metavar="NAME=N")
    ap.add_argument("--atol", type=float, default=2e-2)
    ap.add_argument("--rtol", type=float, default=2e-2)
    ap.add_argument("--runs", type=int, default=20, help="timed runs after one warm-up")
    args = ap.parse_args(argv)

    import time

    import tvm

    from tvmopt.runtime import verify
    from tvmopt.runtime.loader import load, random_inputs

    dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    if not tvm.cuda(0).exist:
        print(json.dumps({"ok": False, "error": "no CUDA device visible to TVM"}))
        return 2
    lm = load(args.artifact)  # checks hashes and that this host has a cuda device
    feeds = random_inputs(lm.inputs, dims)
    got = lm.run(feeds)
    dev_args = lm.to_device(feeds)
    lm.run_device(dev_args)
    tvm.cuda(0).sync()
    t0 = time.perf_counter()
    for _ in range(args.runs):
        lm.run_device(dev_args)
    tvm.cuda(0).sync()
    ms = (time.perf_counter() - t0) / args.runs * 1e3
    ref = verify.run_onnxruntime(args.model, feeds)
    errs = verify.compare(got, ref, verify.Tolerance(args.atol, args.rtol))
    torch_ok = None
    try:
        import torch

        if torch.cuda.is_available():
            torch_ok = all(torch.allclose(torch.from_numpy(got[n]).cuda(), torch.from_numpy(r).cuda(),
                                          atol=args.atol, rtol=args.rtol) for n, r in ref.items())
    except ImportError:
        pass
    ok = all(e.mismatched == 0 for e in errs) and torch_ok is not False
    print(json.dumps({"ok": ok, "gpu": tvm.cuda(0).device_name, "artifact": args.artifact,
                      "precision": lm.artifact.manifest.get("precision", {}).get("default"),
                      "mean_ms": round(ms, 4), "torch_allclose": torch_ok,
                      "errors": [{"name": e.name, "max_abs": e.max_abs, "max_rel": e.max_rel,
                                  "mismatched": e.mismatched, "total": e.total} for e in errs]}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
