"""Per-kernel profiles on each runtime, reduced to `causes.Kernel` rows.

onnxruntime: its own profiler (`SessionOptions.enable_profiling`); every node event carries the
op type (after onnxruntime's graph fusions), the shapes and the parameter bytes. Warm-up runs
are dropped and each node's time is its median over the profiled runs.
tvmopt: the VM instrument hook (`bench.profile.kernel_profile`) with each call's argument shapes;
TIR kernels matched to the plan the compile stored in the manifest (fused ops, FLOPs, bytes),
library calls described by their own arguments (primitive, precision, shapes).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from .causes import (LIBRARY_FUNCS, OTHER, WEIGHT_PREPACK_SUFFIX, Kernel, classify_ort,
                     classify_tvm, kernel_ops, library_call, library_cause, plan_name,
                     tensor_bytes)

# onnxruntime's time inside model_run but outside every node (its executor, allocations)
OUTSIDE = "(outside kernels)"


def ort_kernels(events: list[dict], warmup: int, ridge: float | None) -> list[Kernel]:
    """Kernels from an onnxruntime profile (the parsed JSON list), warm-up runs dropped.

    Each node event is assigned to the `model_run` that contains it; a node's time per run is
    the median over the kept runs of its summed durations in that run.
    """
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    kept = runs[warmup:] if len(runs) > warmup else runs
    if not kept:
        return []
    starts = [r[0] for r in kept]
    per_run: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(kept))
    calls: dict[str, list[int]] = defaultdict(lambda: [0] * len(kept))
    info: dict[str, dict] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        i = int(np.searchsorted(starts, e["ts"], side="right")) - 1
        if i < 0 or e["ts"] > kept[i][1]:
            continue
        name = e["name"][: -len("_kernel_time")]
        per_run[name][i] += e["dur"] / 1e3
        calls[name][i] += 1
        info.setdefault(name, e.get("args", {}))
    outside = [max(0.0, (end - start) / 1e3 - sum(t[i] for t in per_run.values()))
               for i, (start, end) in enumerate(kept)]
    out = [Kernel(name=OUTSIDE, op="session overhead", cause="lost_fusion", calls=0.0,
                  ms=float(np.median(outside)))]
    for name, times in per_run.items():
        if name == OUTSIDE:
            continue
        a = info[name]
        op = a.get("op_name", "?")
        cause, flops, nbytes = classify_ort(op, a.get("input_type_shape"),
                                            a.get("output_type_shape"),
                                            float(a.get("parameter_size") or 0), ridge)
        out.append(Kernel(name=name, op=op, cause=cause, calls=float(np.median(calls[name])),
                          ms=float(np.median(times)), flops=flops, bytes=nbytes,
                          intensity=flops / nbytes if nbytes else None))
    return sorted(out, key=lambda k: k.ms, reverse=True)


def profile_ort(model_path: str, feeds: dict, threads: int, runs: int = 20,
                warmup: int = 3, ridge: float | None = None) -> list[Kernel]:
    """Profile `runs` onnxruntime runs (after `warmup`) of the model on `feeds`."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="tvmopt-ort-prof-") as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        for _ in range(warmup + runs):
            sess.run(None, feeds)
        path = sess.end_profiling()
        events = json.loads(Path(path).read_text())
    return ort_kernels(events, warmup, ridge)


def _dtypes(sig: dict | None) -> list[str]:
    return [a[1] for a in (sig or {}).get("args", []) if isinstance(a, list)]


def _library_rows(row: dict, ridge: float | None) -> list[Kernel] | None:
    """One Kernel per workload of a library function's profile row (None: not a library call,
    or profiled without arguments)."""
    if row["name"] not in LIBRARY_FUNCS or not row.get("signatures"):
        return None
    out = []
    for sig in row["signatures"]:
        call = library_call(row["name"], sig["args"])
        if call is None:
            out.append(Kernel(name=row["name"], op=row["name"], cause=OTHER,
                              calls=sig["calls_per_run"], ms=sig["total_ms_per_run"]))
            continue
        out.append(Kernel(name=f"{row['name']}[{call.shapes}]", op=call.op,
                          cause=library_cause(call, ridge), calls=sig["calls_per_run"],
                          ms=sig["total_ms_per_run"], flops=call.flops * sig["calls_per_run"],
                          bytes=call.bytes * sig["calls_per_run"],
                          intensity=call.flops / call.bytes if call.bytes else None,
                          ops=[call.primitive], source="library"))
    return out


def tvm_kernels(profile: dict, plan: dict | None, ridge: float | None,
                quantized_model: bool) -> list[Kernel]:
    """Kernels from `bench.profile.kernel_profile` output: TIR kernels matched to the manifest's
    plan, library calls split by workload, VM builtins by what they do."""
    # the planned fp32 kernels, then the kernels as built where precision rewrites changed them
    by_name = {k["name"]: k for k in (plan or {}).get("kernels", [])}
    by_name.update({k["name"]: k for k in (plan or {}).get("compiled", [])})
    out = []
    for row in profile["kernels"]:
        name = row["name"]
        lib = _library_rows(row, ridge)
        if lib is not None:
            out.extend(lib)
            continue
        pk = by_name.get(plan_name(name))
        builtin = name.startswith("vm.")
        prepack = name.endswith(WEIGHT_PREPACK_SUFFIX)
        source = ("plan" if pk else "builtin" if builtin else "prepack" if prepack else "name")
        ops = (pk["ops"] if pk else [] if builtin else ["layout_transform"] if prepack
               else kernel_ops(name))
        flops = pk["flops"] if pk else None
        nbytes = pk["bytes"] if pk else None
        sigs = row.get("signatures") or []
        dtypes = _dtypes(sigs[0]) if sigs and not builtin else None
        if nbytes is None and dtypes:  # a kernel the plan does not list: its buffers' bytes
            nbytes = sum(tensor_bytes(a) for a in sigs[0]["args"] if isinstance(a, list))
        cause = classify_tvm(name, ops, flops, nbytes, ridge, quantized_model, dtypes)
        out.append(Kernel(name=name, op="+".join(dict.fromkeys(ops)) or name, cause=cause,
                          calls=row["calls_per_run"], ms=row["total_ms_per_run"],
                          flops=flops * row["calls_per_run"] if flops else None,
                          bytes=nbytes * row["calls_per_run"] if nbytes else None,
                          intensity=(flops / nbytes) if flops and nbytes else None,
                          ops=list(ops), source=source))
    return out


def profile_tvm(loaded, args, runs: int, ridge: float | None,
                quantized_model: bool) -> list[Kernel]:
    """Profile a loaded tvmopt artifact (every kernel, not only the top rows)."""
    from ..bench.profile import kernel_profile

    prof = kernel_profile(loaded, args, runs=runs, top=1_000_000, signatures=True)
    return tvm_kernels(prof, loaded.artifact.manifest.get("plan"), ridge, quantized_model)
