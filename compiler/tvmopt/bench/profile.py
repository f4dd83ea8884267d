"""Per-kernel profile of an artifact: time of every VM call (fused TIR kernels, builtins).

Uses the Relax VM's instrument hook (`VirtualMachine.set_instrument`; TVM 0.27 dropped
`profile=True`), which is called before and after each Call instruction with the callee's symbol.
The hook costs a Python round trip per call, so shares are trustworthy, absolute times a bit high.
"""

from __future__ import annotations

import time
from collections import defaultdict


def kernel_profile(loaded, args, runs: int = 5, top: int = 10) -> dict:
    """Time each kernel over `runs` instrumented calls of main (after one warm-up).

    Args:
        loaded: runtime.LoadedModel.
        args: device inputs (LoadedModel.to_device).
        runs: instrumented runs to average over.
        top: rows to keep, by total time.

    Returns:
        {"runs", "kernels": [{"name", "calls_per_run", "mean_us", "total_ms_per_run", "share"}],
         "total_ms_per_run", "other_ms_per_run" (outside the top rows), "kernel_count"}
    """
    from tvm.runtime.vm import VMInstrumentReturnKind

    dev = loaded.device
    totals: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    started: list[float] = []

    def instrument(func, name, before_run, ret_value, *fargs):
        if before_run:
            started.append(time.perf_counter())
        else:
            dev.sync()
            totals[str(name)] += time.perf_counter() - started.pop()
            calls[str(name)] += 1
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
    return {"runs": runs, "kernels": kernels, "kernel_count": len(rows),
            "total_ms_per_run": grand / runs * 1e3,
            "other_ms_per_run": sum(totals[n] for n in rows[top:]) / runs * 1e3}
