#!/usr/bin/env python3
"""Where the time of a tuned tvmopt call goes, and runtime A/B tests against onnxruntime.

    TVM_NUM_THREADS=2 python tools/profile_overhead.py                  # every bundled model
    TVM_NUM_THREADS=1 python tools/profile_overhead.py --models resnet_cnn --rounds 40

Each bundled model is built from its committed database (--require-db semantics) once per Relax
VM execution mode ("bytecode": the VM interpreter; "compiled": the VM instructions lowered to C)
and timed *interleaved* with onnxruntime (as many threads as TVM's pool) in one process: rounds of --calls calls each, the order
rotating every round, so load from other processes hits every runtime alike.

Then the profile: every VM call (kernel or builtin) is timed inside 20 real runs through the
VM's instrument hook, minimum per call. Their sums against the fastest end-to-end call split a
call into kernel time, builtins (allocation, reshape) and the rest (VM interpretation, entry).
Thread count and binding come from the environment (TVM_NUM_THREADS, TVM_BIND_THREADS) because
TVM reads them when its pool starts; compare runs by their ratio to onnxruntime, which is
measured in the same process.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
ROOT = Path(__file__).resolve().parent.parent


# Batch 1, the shapes the bundled databases were tuned at (see their tvmopt-db.json).
SHAPES = {"mobile_cnn": {"input": (1, 3, 96, 96)}, "resnet_cnn": {"input": (1, 3, 96, 96)},
          "tiny_bert": {"input_ids": (1, 32)}}
TARGET = "x86"


def _feeds(name: str) -> dict:
    rng = np.random.default_rng(0)
    if name == "tiny_bert":
        return {"input_ids": rng.integers(0, 1000, SHAPES[name]["input_ids"]).astype("int64")}
    return {k: rng.standard_normal(s).astype("float32") for k, s in SHAPES[name].items()}


def build_modes(name: str, model: Path, db: Path, out: Path, modes) -> dict[str, Path]:
    """One library per exec mode, from the same optimized module (database replayed)."""
    import tvm

    from tvmopt import pipeline
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.frontend.onnx_model import load_onnx
    from tvmopt.targets.registry import get_target
    from tvmopt.tuning.database import db_weight_prepack
    from tvmopt.tuning.replay import replay_database

    hw = get_target(TARGET)
    target = hw.to_tvm()
    imported = import_onnx(load_onnx(str(model)), SHAPES[name])
    cfg = pipeline.PipelineConfig(dispatch="codegen", weight_prepack=db_weight_prepack(db))
    fused = pipeline.optimize(imported.mod, target, cfg, until=pipeline.FRONT_HALF).mod
    cfg.database = replay_database(str(db), hw, fused, True).db
    libs = {}
    for mode in modes:
        cfg.exec_mode = mode
        ex = pipeline.build(fused, target, cfg, start_after=pipeline.FRONT_HALF)
        libs[mode] = out / f"{name}-{mode}.so"
        ex.export_library(str(libs[mode]))
    return libs


def interleaved(fns: dict, rounds: int, calls: int) -> dict[str, np.ndarray]:
    """Per-call latencies (ms) of each fn, `calls` at a time, rotating the order each round."""
    names = list(fns)
    for fn in fns.values():  # warm-up
        for _ in range(10):
            fn()
    out = defaultdict(list)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = fns[name]
            for _ in range(calls):
                t = time.perf_counter()
                fn()
                out[name].append(time.perf_counter() - t)
    return {k: np.array(v) * 1e3 for k, v in out.items()}


def kernel_times(vm, dev, args, runs: int = 20) -> dict:
    """Each VM call's time inside real runs (instrument hook), minimum over `runs` runs.

    Timed in place, not re-run alone: re-timing a kernel alone on copies of its arguments gave
    sums 1.5-2x the end-to-end time here (other processes on the 2 cores, cold caches). The
    hook adds a Python round trip per call, so the sum over calls is an upper bound.
    """
    import time as _t

    from tvm.runtime.vm import VMInstrumentReturnKind

    per_run: list[list[tuple[str, float]]] = []
    stack: list[float] = []

    def hook(func, name, before_run, ret_value, *fargs):
        if before_run:
            stack.append(_t.perf_counter())
        else:
            per_run[-1].append((str(name), _t.perf_counter() - stack.pop()))
        return VMInstrumentReturnKind.NO_OP

    vm["main"](*args)
    vm.set_instrument(hook)
    try:
        for _ in range(runs):
            per_run.append([])
            vm["main"](*args)
    finally:
        vm.set_instrument(None)
    names = [n for n, _ in per_run[0]]
    best = np.min(np.array([[t for _, t in run] for run in per_run]), axis=0) * 1e3
    per = list(zip(names, best))
    kern = [(n, t) for n, t in per if not n.startswith("vm.builtin.")]
    return {"calls": len(per), "kernels": len(kern), "builtins": len(per) - len(kern),
            "kernel_sum_ms": float(sum(t for _, t in kern)),
            "builtin_sum_ms": float(sum(t for n, t in per if n.startswith("vm.builtin."))),
            "per_kernel": kern}


def main(argv=None) -> int:
    import tvm
    from tvm import relax

    from tvmopt.models import bundled
    from tvmopt.tuning.database import bundled_db_dir
    from tvmopt.runtime.verify import ort_session

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobile_cnn,resnet_cnn,tiny_bert")
    ap.add_argument("--modes", default="bytecode,compiled")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--top", type=int, default=5, help="Slowest kernels to list per model.")
    ap.add_argument("--db-root", type=Path, help="Folder holding <model>/ databases "
                                                 "[default: the committed schedules/].")
    args = ap.parse_args(argv)
    models = bundled()
    cores = int(os.environ["TVM_NUM_THREADS"])  # onnxruntime gets as many threads as TVM
    print(f"TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']} "
          f"TVM_BIND_THREADS={os.environ.get('TVM_BIND_THREADS', '(unset)')} ort threads={cores}, "
          f"{args.rounds} rounds x {args.calls} calls, interleaved")
    dev = tvm.cpu(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name in filter(None, args.models.split(",")):
            db = args.db_root / name if args.db_root else bundled_db_dir(name, "x86-avx2")
            libs = build_modes(name, models[name], db, Path(tmp), args.modes.split(","))
            feeds = _feeds(name)
            sess = ort_session(str(models[name]), threads=cores)
            ref = sess.run(None, feeds)[0]
            fns = {"onnxruntime": lambda: sess.run(None, feeds)}
            loaded = {}
            for mode, path in libs.items():
                lib = tvm.runtime.load_module(str(path))
                vm = relax.VirtualMachine(lib, dev)
                targs = [tvm.runtime.tensor(np.ascontiguousarray(v), dev) for v in feeds.values()]
                got = vm["main"](*targs)
                got = got.numpy() if hasattr(got, "numpy") else got[0].numpy()
                err = float(np.max(np.abs(got - ref)))
                if err > 1e-3:
                    raise SystemExit(f"{name} {mode}: output differs from onnxruntime by {err:.2e}")
                loaded[mode] = (lib, vm, targs)
                fns[f"tvm {mode}"] = (lambda vm=vm, targs=targs: vm["main"](*targs))
            lat = interleaved(fns, args.rounds, args.calls)
            ort = float(np.median(lat["onnxruntime"]))
            lib, vm, targs = loaded[args.modes.split(",")[0]]
            prof = kernel_times(vm, dev, targs)
            print(f"\n{name}: {prof['calls']} VM calls per run = {prof['kernels']} kernels + "
                  f"{prof['builtins']} builtins (alloc/reshape/null)")
            for k, v in lat.items():
                print(f"  {k:14s} median {np.median(v):.3f} ms  min {np.min(v):.3f} ms  "
                      f"P95 {np.percentile(v, 95):.3f} ms  x ORT (medians) {np.median(v) / ort:.2f}")
            e2e = float(np.min(lat[f"tvm {args.modes.split(',')[0]}"]))
            ks = prof["kernel_sum_ms"]
            bs = prof["builtin_sum_ms"]
            print(f"  in-run minima: kernels {ks:.3f} ms = {ks / e2e:.0%} of the fastest "
                  f"{args.modes.split(',')[0]} call ({e2e:.3f} ms); builtins {bs:.3f} ms; the rest "
                  f"{e2e - ks - bs:.3f} ms")
            for n, t in sorted(prof["per_kernel"], key=lambda x: -x[1])[:args.top]:
                print(f"    {t * 1e3:8.1f} us  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
