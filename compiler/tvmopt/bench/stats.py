"""Latency statistics: percentiles (numpy, linear interpolation), spread and throughput."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

# Percentiles reported everywhere; 99.9 needs >= 1000 samples to be more than the max.
PERCENTILES = (50, 90, 95, 99, 99.9)
# Above this coefficient of variation the figures move run to run more than most speedups we
# care about (10-20%); the report says so instead of presenting them as solid.
NOISY_CV = 0.10


@dataclass
class LatencyStats:
    """Summary of latency samples, in milliseconds (throughput in items per second)."""

    n: int
    min_ms: float
    mean_ms: float
    std_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    cv: float
    throughput: float
    noisy: bool

    def to_json(self) -> dict:
        return asdict(self)


def _key(p: float) -> str:
    return "p" + (f"{p:g}".replace(".", "")) + "_ms"


def summarize(samples_s, items_per_call: int = 1) -> LatencyStats:
    """Summarize per-call latencies.

    Args:
        samples_s: latencies of individual calls, in seconds.
        items_per_call: samples processed per call (the batch size), for throughput.

    Returns:
        LatencyStats in milliseconds; throughput = items_per_call / mean latency.

    Raises:
        ValueError: no samples.
    """
    a = np.asarray(samples_s, dtype=np.float64) * 1e3
    if a.size == 0:
        raise ValueError("no latency samples to summarize")
    mean = float(a.mean())
    std = float(a.std(ddof=1)) if a.size > 1 else 0.0
    pct = np.percentile(a, PERCENTILES)
    fields = {_key(p): float(v) for p, v in zip(PERCENTILES, pct)}
    cv = std / mean if mean > 0 else 0.0
    return LatencyStats(n=int(a.size), min_ms=float(a.min()), mean_ms=mean, std_ms=std,
                        max_ms=float(a.max()), cv=cv,
                        throughput=(items_per_call * 1e3 / mean) if mean > 0 else float("inf"),
                        noisy=cv > NOISY_CV, **fields)


def trend(x, y) -> float:
    """Least-squares slope of y over x (0 with fewer than 2 distinct x)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0:
        return 0.0
    return float(np.polyfit(x, y, 1)[0])
