"""A short latency comparison used by `tvmopt demo`: tvmopt vs onnxruntime, same inputs, one run."""

from __future__ import annotations

import time

import numpy as np


def _time(fn, runs: int, warmup: int = 5) -> np.ndarray:
    for _ in range(warmup):
        fn()
    out = np.empty(runs)
    for i in range(runs):
        t = time.perf_counter()
        fn()
        out[i] = time.perf_counter() - t
    return out * 1e3


def latency_summary(artifact_path, model_path, runs: int = 50) -> list[dict]:
    """Median and P95 latency of the artifact and of onnxruntime (threads = cores)."""
    import os

    from .runtime import load, random_inputs
    from .verify import ort_session

    lm = load(artifact_path)
    feeds = random_inputs(lm.inputs)
    args = lm.to_device(feeds)
    sess = ort_session(str(model_path), threads=os.cpu_count())
    rows = []
    for name, fn in (("tvmopt", lambda: lm.run_device(args)),
                     ("onnxruntime", lambda: sess.run(None, feeds))):
        ms = _time(fn, runs)
        rows.append({"runtime": name, "median_ms": float(np.median(ms)),
                     "p95_ms": float(np.percentile(ms, 95))})
    ort = rows[1]["median_ms"]
    for r in rows:
        r["ratio_to_ort"] = r["median_ms"] / ort
    return rows
