"""Closed-loop latency: one request in flight, the next issued when the previous returns.

Several runners are measured interleaved in short blocks (round-robin, rotating who goes first
each round) so slow drifts of a shared, busy machine hit every runner alike instead of whichever
ran last. Blocks rather than single calls because runtimes keep their thread pools spinning for
a while after a call (onnxruntime, OpenMP in torch, TVM's pool): alternating call by call makes
each runner compete with the previous one's spinning threads, which measures the harness, not
the runtime; and between blocks the harness idles `settle_s` so those threads go to sleep
before the next runner starts (on a few busy cores, a runner started while another's pool still
spins is timed mostly waiting for cores). The gap outlasts the longest of those spins
(onnxruntime's, which spins several times longer than libgomp).
"""

from __future__ import annotations

from dataclasses import dataclass

from .stats import LatencyStats, summarize


@dataclass
class ClosedLoopResult:
    """One runner at one (batch, size): warm-up and steady-state statistics."""

    runner: str
    batch: int
    size: int | None
    warmup: LatencyStats | None
    steady: LatencyStats
    samples_s: list[float]

    def to_json(self, with_samples: bool = True) -> dict:
        d = {"runner": self.runner, "batch": self.batch, "size": self.size,
             "warmup": self.warmup.to_json() if self.warmup else None,
             "steady": self.steady.to_json()}
        if with_samples:
            d["samples_ms"] = [s * 1e3 for s in self.samples_s]
        return d


def _timed(runner, clock, batch, size) -> float:
    t = clock.now()
    runner.run(batch, size)
    elapsed = clock.now() - t
    # A runner in a worker process times the call itself: the pipe is not the runtime.
    own = getattr(runner, "measured_s", None)
    return own if own is not None else elapsed


def measure(runners: list, clock, batch: int, size: int | None = None, warmup: int = 5,
            runs: int = 50, max_seconds: float | None = None,
            min_runs: int = 5, block: int = 5, settle_s: float = 0.1) -> list[ClosedLoopResult]:
    """Warm up, then time `runs` calls of each runner, interleaved.

    Args:
        runners: Runner objects (already constructed); each is prepared before timing.
        clock: RealClock or SimClock.
        batch: batch size of every call; throughput counts batch items per second.
        size: value of the model's size dim (sequence length), if it has one.
        warmup: untimed-for-the-summary calls per runner first (reported separately).
        runs: timed calls per runner.
        max_seconds: stop after this much time across all runners (at least `min_runs` each),
            so one slow configuration cannot stall a sweep.
        min_runs: floor for the time limit.
        block: consecutive calls of one runner before switching to the next.
        settle_s: idle time before each block when several runners alternate (untimed; the
            time budget counts only timed calls).

    Returns:
        One ClosedLoopResult per runner, in the order given.
    """
    for r in runners:
        r.prepare(batch, size)
    warm = {}
    for r in runners:
        clock.sleep(settle_s if len(runners) > 1 else 0.0)
        warm[r.name] = [_timed(r, clock, batch, size) for _ in range(warmup)]
    samples = {r.name: [] for r in runners}
    settle = settle_s if len(runners) > 1 else 0.0
    spent, done, rnd = 0.0, 0, 0
    while done < runs:
        n = min(block, runs - done)
        k = rnd % len(runners)
        for r in runners[k:] + runners[:k]:
            clock.sleep(settle)
            t = clock.now()
            samples[r.name].extend(_timed(r, clock, batch, size) for _ in range(n))
            spent += clock.now() - t
        done += n
        rnd += 1
        if max_seconds is not None and done >= min_runs and spent > max_seconds:
            break
    return [ClosedLoopResult(r.name, batch, size,
                             summarize(warm[r.name], batch) if warm[r.name] else None,
                             summarize(samples[r.name], batch), samples[r.name])
            for r in runners]
