"""Per-kernel profile of an artifact: time of every VM call (fused TIR kernels, builtins).

Uses the Relax VM's instrument hook (`VirtualMachine.set_instrument`; TVM 0.27 dropped
`profile=True`), which is called before and after each Call instruction with the callee's symbol
and its arguments. The hook costs a Python round trip per call, so shares are trustworthy,
absolute times a bit high.
"""

from __future__ import annotations

import time
from collections import defaultdict


def _arg_facts(arg):
    """A call argument as JSON: [shape, dtype] for a tensor, {"shape": [...]} for an ffi Shape
    (library calls pass their attributes as one), None for anything else."""
    dtype = getattr(arg, "dtype", None)
    shape = getattr(arg, "shape", None)
    if dtype is not None and shape is not None:
        return [[int(d) for d in shape], str(dtype)]
    if type(arg).__name__ == "Shape":
        return {"shape": [int(d) for d in arg]}
    return None


def kernel_profile(loaded, args, runs: int = 5, top: int = 10, signatures: bool = False) -> dict:
    """Time each kernel over `runs` instrumented calls of main (after one warm-up).

    Args:
        loaded: runtime.LoadedModel.
        args: device inputs (LoadedModel.to_device).
        runs: instrumented runs to average over.
        top: rows to keep, by total time.
        signatures: also split each row by the shapes and dtypes of its arguments (one library
            function runs many workloads); read after the timer stops, so it costs no kernel time.

    Returns:
        {"runs", "kernels": [{"name", "calls_per_run", "mean_us", "total_ms_per_run", "share"}],
         "total_ms_per_run", "other_ms_per_run" (outside the top rows), "kernel_count"}; with
        `signatures`, each kernel also has "signatures": [{"args", "calls_per_run",
        "total_ms_per_run"}] (args as `_arg_facts` gives them).
    """
    from tvm.runtime.vm import VMInstrumentReturnKind

    dev = loaded.device
    totals: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    by_sig: dict[tuple, list] = {}
    started: list[float] = []

    def instrument(func, name, before_run, ret_value, *fargs):
        if before_run:
            started.append(time.perf_counter())
        else:
            dev.sync()
            dt = time.perf_counter() - started.pop()
            totals[str(name)] += dt
            calls[str(name)] += 1
            if signatures:
                facts = [_arg_facts(a) for a in fargs]
                key = (str(name), repr(facts))
                row = by_sig.setdefault(key, [facts, 0, 0.0])
                row[1] += 1
                row[2] += dt
        return VMInstrumentReturnKind.NO_OP

    loaded.run_device(args)  # warm-up: first-call allocations are not a kernel's cost
    loaded.vm.set_instrument(instrument)
    try:
        for _ in range(runs):
            loaded.run_device(args)
            dev.sync()
    finally:
        loaded.vm.set_instrument(None)
    grand = sum(totals.values())
    rows = sorted(totals, key=totals.get, reverse=True)
    kernels = [{"name": n, "calls_per_run": calls[n] / runs,
                "mean_us": totals[n] / calls[n] * 1e6,
                "total_ms_per_run": totals[n] / runs * 1e3,
                "share": totals[n] / grand if grand else 0.0} for n in rows[:top]]
    if signatures:
        for k in kernels:
            sigs = [v for (n, _), v in by_sig.items() if n == k["name"]]
            k["signatures"] = [{"args": f, "calls_per_run": c / runs,
                                "total_ms_per_run": t / runs * 1e3}
                               for f, c, t in sorted(sigs, key=lambda v: v[2], reverse=True)]
    return {"runs": runs, "kernels": kernels, "kernel_count": len(rows),
            "total_ms_per_run": grand / runs * 1e3,
            "other_ms_per_run": sum(totals[n] for n in rows[top:]) / runs * 1e3}
