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
    results = measure(runners, RealClock(), batch=factory.static_batch or 1, warmup=5, runs=runs)
    rows = [{"runtime": r.runner, "median_ms": r.steady.p50_ms, "p95_ms": r.steady.p95_ms}
            for r in results]
    ort = rows[-1]["median_ms"]
    for r in rows:
        r["ratio_to_ort"] = r["median_ms"] / ort
    return rows
