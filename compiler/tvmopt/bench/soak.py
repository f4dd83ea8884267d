"""Soak: run closed loop for a while, in windows, watching latency drift and RSS growth."""

from __future__ import annotations

import numpy as np

from .stats import summarize, trend

# A leak: RSS still climbing over the second half of the soak, by more than this many bytes per
# minute and more than this fraction of the starting RSS in total. The first half is excluded
# because caches and allocator pools legitimately grow while warming up.
LEAK_BYTES_PER_MIN = 1 << 20
LEAK_MIN_GROWTH = 0.02
# Latency drift worth flagging: last window's median this much above the first's.
DRIFT_WARN = 0.20


def soak(runner, clock, batch: int, duration_s: float, windows: int = 10,
         rss_fn=None, size: int | None = None, max_calls: int = 1_000_000) -> dict:
    """Run `runner` back to back for `duration_s`, summarizing each of `windows` windows.

    Args:
        runner: a prepared-able Runner.
        clock: RealClock or SimClock.
        batch: batch per call.
        duration_s: soak length.
        windows: how many equal windows to summarize.
        rss_fn: () -> bytes (default: this process's RSS; tests pass a fake).
        size: size-dim value, if any.
        max_calls: a bound on calls, whatever the clock does.

    Returns:
        The JSON 'soak' section: per-window stats, drift, RSS slope and a leak flag.
    """
    from .memory import rss_bytes

    rss_fn = rss_fn or rss_bytes
    runner.prepare(batch, size)
    runner.run(batch, size)  # warm-up
    win_len = duration_s / windows
    start = clock.now()
    rows = []
    calls = 0
    for w in range(windows):
        lat = []
        end = start + (w + 1) * win_len
        while clock.now() < end and calls < max_calls:
            t = clock.now()
            runner.run(batch, size)
            lat.append(clock.now() - t)
            calls += 1
        if not lat:
            continue
        s = summarize(lat, batch)
        rows.append({"window": w, "t_s": clock.now() - start, "calls": len(lat),
                     "p50_ms": s.p50_ms, "p99_ms": s.p99_ms, "rss_bytes": int(rss_fn())})
    t = np.array([r["t_s"] for r in rows])
    rss = np.array([r["rss_bytes"] for r in rows], dtype=np.float64)
    half = rows[len(rows) // 2:]
    slope_half = trend([r["t_s"] for r in half], [r["rss_bytes"] for r in half]) * 60
    growth = (rss[-1] - rss[0]) / rss[0] if len(rss) and rss[0] else 0.0
    leak = bool(len(half) >= 2 and slope_half > LEAK_BYTES_PER_MIN and growth > LEAK_MIN_GROWTH
                and all(b["rss_bytes"] >= a["rss_bytes"] for a, b in zip(half, half[1:])))
    drift = (rows[-1]["p50_ms"] - rows[0]["p50_ms"]) / rows[0]["p50_ms"] if rows else 0.0
    return {"duration_s": duration_s, "batch": batch, "calls": calls, "windows": rows,
            "p50_drift": drift, "p50_slope_ms_per_min": trend(t, [r["p50_ms"] for r in rows]) * 60,
            "drifting": bool(drift > DRIFT_WARN),
            "rss_growth": growth, "rss_slope_bytes_per_min": trend(t, rss) * 60,
            "leak_suspected": leak}
