"""A short latency comparison used by `tvmopt demo`: tvmopt vs onnxruntime, same inputs, one run.

Measured with the bench harness's closed loop (interleaved blocks, warm-up apart), so the demo's
figures agree with `tvmopt bench`.
"""

from __future__ import annotations


def latency_summary(artifact_path, model_path, runs: int = 50,
                    others: dict | None = None) -> list[dict]:
    """Median and P95 latency of the artifact and of onnxruntime (threads = cores).

    Args:
        others: label -> another artifact of the same model, timed in the same interleaved run
            (e.g. the untuned build beside the tuned one); rows come after the artifact's,
            onnxruntime last.
    """
    import os
    import time

    from ..kernels.timing import _busy_seconds
    from .clock import RealClock
    from .closed_loop import measure
    from .runner import ArtifactRunner, InputFactory, OrtRunner
    from ..runtime.loader import load

    lm = load(artifact_path)
    factory = InputFactory(lm.inputs)
    runners = [ArtifactRunner(lm, factory)]
    for label, path in (others or {}).items():
        runners.append(ArtifactRunner(load(path), factory, name=label))
    runners.append(OrtRunner(str(model_path), factory, os.cpu_count()))
    busy0, me0 = _busy_seconds()
    t0 = time.perf_counter()
    results = measure(runners, RealClock(), batch=factory.static_batch or 1, warmup=5, runs=runs)
    busy1, me1 = _busy_seconds()
    # Cores other processes kept busy meanwhile: on a shared machine the kernels' thread team
    # waits for a descheduled thread at every parallel region, and the figures stop meaning much.
    foreign = max(0.0, (busy1 - busy0) - (me1 - me0)) / max(time.perf_counter() - t0, 1e-9)
    rows = [{"runtime": r.runner, "median_ms": r.steady.p50_ms, "p95_ms": r.steady.p95_ms,
             "foreign_load": round(foreign, 2)} for r in results]
    ort = rows[-1]["median_ms"]
    for r in rows:
        r["ratio_to_ort"] = r["median_ms"] / ort
    return rows
