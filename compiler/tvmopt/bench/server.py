"""An in-process inference server: a FIFO queue in front of one runner, with dynamic batching.

Policy: the oldest queued request opens a batch; compatible requests (same size-dim value, or
any when sizes are batch items) join while the batch has room for `max_batch` items; the batch
runs when full, when the oldest has waited `max_wait_s`, or when no more requests will come.
Requests are dropped when the queue is full on arrival and time out when they wait longer than
`timeout_s` before starting. Latency is end-to-end from the *scheduled* arrival time, so time a
request spent waiting behind a slow batch is counted (no coordinated omission).

The same loop runs on a SimClock (arrivals replayed from the schedule: exact, for tests) or on
the real clock, where a client thread issues requests at their times into a thread-safe queue.
"""

from __future__ import annotations

import queue as _queue
import threading
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

from ..errors import TvmoptError
from .load import Request
from .stats import summarize, trend


@dataclass(frozen=True)
class BatchPolicy:
    """Dynamic batching and admission limits."""

    max_batch: int = 8          # items per batch
    max_wait_s: float = 0.005   # how long the oldest request may wait for company
    timeout_s: float | None = 1.0  # a request not started within this is dropped as timed out
    max_queue: int = 1000       # requests queued beyond this are dropped on arrival

    def __post_init__(self):
        if self.max_batch < 1 or self.max_wait_s < 0 or self.max_queue < 1:
            raise ValueError("max_batch and max_queue must be >= 1, max_wait_s >= 0")


class _ScheduledArrivals:
    """Replays the schedule on a SimClock: a request exists once the clock reaches its time."""

    def __init__(self, requests, clock, t0):
        self.pending = deque(sorted(requests, key=lambda r: r.t))
        self.clock, self.t0 = clock, t0

    def poll(self) -> list[Request]:
        out = []
        while self.pending and self.t0 + self.pending[0].t <= self.clock.now():
            out.append(self.pending.popleft())
        return out

    def wait(self, until: float | None) -> None:
        times = [x for x in (self.t0 + self.pending[0].t if self.pending else None, until)
                 if x is not None]
        if times:
            self.clock.advance_to(min(times))

    def done(self) -> bool:
        return not self.pending

    def close(self) -> None:
        pass


class _ThreadedArrivals:
    """A client thread that sleeps until each request's time and enqueues it."""

    def __init__(self, requests, clock, t0):
        self.q: _queue.Queue = _queue.Queue()
        self.clock, self.t0 = clock, t0
        self.buffer: list[Request] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._client, args=(sorted(requests, key=lambda r: r.t),),
                                        daemon=True, name="tvmopt-bench-client")
        self._thread.start()

    def _client(self, requests):
        for r in requests:
            delay = self.t0 + r.t - self.clock.now()
            if delay > 0 and self._stop.wait(delay):
                return
            self.q.put(r)

    def poll(self) -> list[Request]:
        out, self.buffer = self.buffer, []
        while True:
            try:
                out.append(self.q.get_nowait())
            except _queue.Empty:
                return out

    def wait(self, until: float | None) -> None:
        # cap the block so the caller re-checks its hard stop even if no request comes
        timeout = 0.05 if until is None else min(max(until - self.clock.now(), 0.0), 0.05)
        try:
            self.buffer.append(self.q.get(timeout=timeout))
        except _queue.Empty:
            pass

    def done(self) -> bool:
        return not self._thread.is_alive() and self.q.empty() and not self.buffer

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


@dataclass
class ServerResult:
    """Per-request and per-batch records of one load test (times relative to its start, s)."""

    requests: list[Request]
    arrival: np.ndarray
    start: np.ndarray      # NaN when never started
    finish: np.ndarray     # NaN when never finished
    status: list[str]      # "ok", "dropped" (queue full), "timed_out" (waited past timeout),
    #                        "failed" (the artifact refused the request's values)
    batches: list[tuple[float, float, int, int]]  # (start, finish, items, requests)
    duration: float        # length of the arrival schedule
    size_is_items: bool = True
    depth: list[tuple[float, int]] | None = None  # (time, queued requests) at each change
    errors: dict[str, int] | None = None  # what failed requests' runs raised, and how often

    def summary(self) -> dict:
        """Everything the report prints and the JSON holds (see docs/performance.md: bench JSON schema)."""
        ok = np.array([s == "ok" for s in self.status], dtype=bool)
        items = np.array([r.value if self.size_is_items else 1 for r in self.requests],
                         dtype=np.float64)
        e2e = (self.finish - self.arrival)[ok]
        wait = (self.start - self.arrival)[ok]
        end = float(np.nanmax(self.finish)) if ok.any() else self.duration
        span = max(end, self.duration, 1e-9)
        busy = sum(f - s for s, f, _, _ in self.batches)
        hist = Counter(n for _, _, n, _ in self.batches)
        out = {
            "requests": len(self.requests),
            "completed": int(ok.sum()),
            "dropped": self.status.count("dropped"),
            "timed_out": self.status.count("timed_out"),
            "failed": self.status.count("failed"),
            "errors": dict(sorted((self.errors or {}).items(), key=lambda kv: -kv[1])[:5]),
            "offered_rate": len(self.requests) / self.duration if self.duration > 0 else 0.0,
            "achieved_rate": float(ok.sum()) / span,
            "achieved_items_per_s": float(items[ok].sum()) / span,
            "utilization": busy / span,
            "batches": len(self.batches),
            "mean_batch_items": float(np.mean([n for _, _, n, _ in self.batches])) if self.batches else 0.0,
            "batch_histogram": {str(k): hist[k] for k in sorted(hist)},
            "latency": summarize(e2e).to_json() if e2e.size else None,
            "queue_wait": summarize(wait).to_json() if wait.size else None,
            "by_size": {},
            "queueing_growth": self._growth(ok),
            "max_queue_depth": max((d for _, d in self.depth or []), default=0),
        }
        # over capacity: the server could not keep up with what was offered, whether that shows
        # as a growing queue, as timeouts/drops (which cap the growth), or as a falling rate
        lost = out["dropped"] + out["timed_out"]
        out["overloaded"] = bool(out["queueing_growth"]["growing"]
                                 or lost > 0.01 * max(len(self.requests), 1)
                                 or out["achieved_rate"] < 0.9 * out["offered_rate"])
        for label in sorted({r.label for r in self.requests}):
            sel = ok & np.array([r.label == label for r in self.requests])
            if sel.any():
                lat = summarize((self.finish - self.arrival)[sel])
                out["by_size"][label] = {"completed": int(sel.sum()), "p50_ms": lat.p50_ms,
                                         "p99_ms": lat.p99_ms}
        return out

    def _growth(self, ok) -> dict:
        """Is latency climbing through the run? (it does when arrivals outpace service)"""
        if ok.sum() < 3:
            return {"first_third_mean_ms": None, "last_third_mean_ms": None,
                    "slope_ms_per_s": 0.0, "growing": False}
        a, lat = self.arrival[ok], (self.finish - self.arrival)[ok] * 1e3
        cut1, cut2 = np.quantile(a, [1 / 3, 2 / 3])
        first, last = lat[a <= cut1].mean(), lat[a >= cut2].mean()
        slope = trend(a, lat)
        # growing: the last third waits at least twice as long as the first and the fit agrees
        return {"first_third_mean_ms": float(first), "last_third_mean_ms": float(last),
                "slope_ms_per_s": slope, "growing": bool(last > 2 * first and slope > 0)}


def serve(runner, clock, requests: list[Request], policy: BatchPolicy,
          size_is_items: bool = True, drain_s: float = 5.0,
          duration: float | None = None) -> ServerResult:
    """Serve `requests` (arrival offsets from now) with dynamic batching; return the records.

    Args:
        runner: the Runner doing the work (one batch at a time, like one model instance).
        clock: RealClock (client thread) or SimClock (exact replay).
        requests: the schedule, from load.generate.
        policy: batching and admission limits.
        size_is_items: a request's value is its number of batch items (True), or the model's
            size-dim value (False: such requests hold one item and batch only with equal sizes).
        drain_s: after the last arrival, how long queued requests may still be served; the
            rest count as timed out. Bounds the test's duration.
        duration: length of the schedule (default: the last arrival time), for rates.
    """
    n = len(requests)
    index = {r.id: i for i, r in enumerate(requests)}
    arrival = np.array([r.t for r in requests], dtype=np.float64)
    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    status = ["pending"] * n
    batches: list[tuple[float, float, int, int]] = []
    depth: list[tuple[float, int]] = [(0.0, 0)]
    errors: dict[str, int] = {}

    def items(r):
        return r.value if size_is_items else 1

    def key(r):
        return None if size_is_items else r.value

    for r in requests:
        if items(r) > policy.max_batch:
            raise ValueError(f"request size {items(r)} exceeds max batch {policy.max_batch}")
    # every batch shape the server can form, prepared before the clock starts
    for k in sorted({key(r) for r in requests}, key=lambda v: -1 if v is None else v):
        for b in range(1, policy.max_batch + 1):
            runner.prepare(b, k)
    t0 = clock.now()
    horizon = (max(arrival) if n else 0.0) + drain_s
    src = (_ScheduledArrivals if clock.simulated else _ThreadedArrivals)(requests, clock, t0)
    q: deque = deque()
    try:
        while True:
            now = clock.now() - t0
            for r in src.poll():
                i = index[r.id]
                if len(q) >= policy.max_queue:
                    status[i] = "dropped"
                else:
                    q.append(r)
            if policy.timeout_s is not None:
                keep = deque()
                for r in q:
                    if now - r.t > policy.timeout_s:
                        status[index[r.id]] = "timed_out"
                    else:
                        keep.append(r)
                q = keep
            if len(q) != depth[-1][1]:
                depth.append((now, len(q)))
            if not q:
                if src.done():
                    break
                src.wait(None)
                continue
            if now > horizon:
                for r in q:
                    status[index[r.id]] = "timed_out"
                break
            head = q[0]
            batch, total = [], 0
            full = False
            for r in q:
                if key(r) != key(head):
                    continue
                if total + items(r) > policy.max_batch:
                    full = True
                    break
                batch.append(r)
                total += items(r)
            full = full or total >= policy.max_batch
            deadline = head.t + policy.max_wait_s
            if not full and now < deadline and not src.done():
                src.wait(t0 + deadline)
                continue
            chosen = {r.id for r in batch}
            q = deque(r for r in q if r.id not in chosen)
            s = clock.now() - t0
            try:
                runner.run(total, key(head))
                outcome = "ok"
            except TvmoptError as err:
                # a request the artifact refuses (a run-time check: an index or size out of
                # range) fails on its own; the server goes on with the next batch
                outcome = "failed"
                errors[str(err)] = errors.get(str(err), 0) + 1
            f = clock.now() - t0
            batches.append((s, f, total, len(batch)))
            for r in batch:
                i = index[r.id]
                start[i], finish[i], status[i] = s, f, outcome
    finally:
        src.close()
    # a request the client had not handed over by the horizon (issued late on a saturated
    # host, or put in the queue after the last poll) was not served either: it counts as
    # timed out, never disappears from the totals
    status = ["timed_out" if st == "pending" else st for st in status]
    if duration is None:
        duration = float(max(arrival)) if n else 0.0
    return ServerResult(list(requests), arrival, start, finish, status, batches, duration,
                        size_is_items, depth, errors)
