"""Statistics, closed loop, load generation and the batching server, on the fake runner.

Every expected figure here follows by hand from the fake runner's fixed service times and a
known arrival sequence on a simulated clock; nothing reads the wall clock.
"""

import numpy as np
import pytest

from tvmopt.bench.clock import SimClock
from tvmopt.bench.closed_loop import measure
from tvmopt.bench.load import (LoadSpecError, Request, burst_arrivals, generate, parse_burst,
                               parse_sizes, poisson_arrivals)
from tvmopt.bench.runner import FakeRunner
from tvmopt.bench.server import BatchPolicy, serve
from tvmopt.bench.stats import summarize, trend


# ------------------------------------------------------------------------------------ stats
def test_percentiles_of_1_to_100_ms():
    s = summarize(np.arange(1, 101) / 1e3)
    assert s.n == 100 and s.min_ms == pytest.approx(1) and s.max_ms == pytest.approx(100)
    assert s.mean_ms == pytest.approx(50.5)
    assert s.p50_ms == pytest.approx(50.5)
    assert s.p90_ms == pytest.approx(90.1)
    assert s.p95_ms == pytest.approx(95.05)
    assert s.p99_ms == pytest.approx(99.01)
    assert s.p999_ms == pytest.approx(99.901)
    assert s.std_ms == pytest.approx(np.std(np.arange(1, 101), ddof=1))
    assert s.cv == pytest.approx(s.std_ms / 50.5)
    assert s.noisy  # cv ~0.57


def test_constant_samples_are_not_noisy_and_throughput_counts_items():
    s = summarize([0.004] * 10, items_per_call=8)
    assert s.std_ms == 0 and s.cv == 0 and not s.noisy
    assert s.throughput == pytest.approx(8 / 0.004)


def test_summarize_rejects_empty():
    with pytest.raises(ValueError):
        summarize([])


def test_trend_is_the_least_squares_slope():
    assert trend([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert trend([1], [5]) == 0.0


# ------------------------------------------------------------------------------------ closed loop
def test_closed_loop_separates_warmup_and_cycles_service_times():
    clock = SimClock()
    fake = FakeRunner(clock, times_s=[0.001, 0.002, 0.003, 0.004])
    (res,) = measure([fake], clock, batch=4, warmup=2, runs=8)
    assert res.warmup.n == 2 and res.warmup.mean_ms == pytest.approx(1.5)
    assert [round(x * 1e3, 6) for x in res.samples_s] == [3, 4, 1, 2, 3, 4, 1, 2]
    assert res.steady.mean_ms == pytest.approx(2.5)
    assert res.steady.p50_ms == pytest.approx(2.5)
    assert res.steady.throughput == pytest.approx(4 / 0.0025)
    assert clock.now() == pytest.approx(0.003 + 0.020)


def test_closed_loop_interleaves_runners_and_stops_at_the_time_budget():
    clock = SimClock()
    a = FakeRunner(clock, service_s=lambda b, s=None: 0.010, name="a")
    b = FakeRunner(clock, service_s=lambda b, s=None: 0.030, name="b")
    order = []
    a.run = lambda batch, size=None, _r=a.run: (order.append("a"), _r(batch, size))
    b.run = lambda batch, size=None, _r=b.run: (order.append("b"), _r(batch, size))
    ra, rb = measure([a, b], clock, batch=1, warmup=0, runs=100, max_seconds=0.5, min_runs=2,
                     block=3)
    # each round is 3 calls of each: 120 ms; the budget is passed after round 5 (600 > 500 ms)
    assert ra.steady.n == rb.steady.n == 15
    assert ra.steady.mean_ms == pytest.approx(10) and rb.steady.mean_ms == pytest.approx(30)
    assert order[:12] == list("aaabbbbbbaaa")  # who goes first alternates
    # 100 ms settle before each runner's warm-up and each of the 10 blocks, outside the samples
    # and the budget
    assert clock.now() == pytest.approx(0.6 + 12 * 0.1)


# ------------------------------------------------------------------------------------ load
def test_parse_sizes_names_values_and_normalizes():
    s = parse_sizes("short:0.6,medium:0.3,long:0.1")
    assert [(c.label, c.value) for c in s] == [("short", 1), ("medium", 4), ("long", 16)]
    assert sum(c.prob for c in s) == pytest.approx(1)
    s = parse_sizes("8:1,seq=128:3")
    assert [(c.label, c.value, c.prob) for c in s] == [("8", 8, 0.25), ("seq", 128, 0.75)]
    for bad in ("short", "huge:1", "short:-1"):
        with pytest.raises(LoadSpecError):
            parse_sizes(bad)


def test_poisson_is_seeded_bounded_and_has_the_asked_rate():
    t1 = poisson_arrivals(100, 50, np.random.default_rng(3))
    t2 = poisson_arrivals(100, 50, np.random.default_rng(3))
    assert np.array_equal(t1, t2)
    assert t1.min() >= 0 and t1.max() < 50 and np.all(np.diff(t1) > 0)
    assert len(t1) == pytest.approx(5000, rel=0.05)  # 5000 +- 71 (1 sd), fixed by the seed
    gaps = np.diff(t1)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential gaps: cv 1
    with pytest.raises(LoadSpecError):
        poisson_arrivals(1e6, 1e3, np.random.default_rng(0))


def test_burst_steps_the_rate():
    phases = parse_burst(None, rate=50, duration=30)
    assert phases == [(10, 50), (10, 200), (10, 50)]
    t = burst_arrivals(phases, np.random.default_rng(0))
    counts = np.histogram(t, bins=[0, 10, 20, 30])[0]
    assert counts[1] > 3 * counts[0] and counts[1] > 3 * counts[2]
    assert parse_burst("10:5,40:2", 1, 1) == [(5.0, 10.0), (2.0, 40.0)]
    with pytest.raises(LoadSpecError):
        parse_burst("fast", 1, 1)


def test_generate_attaches_the_size_mix():
    reqs = generate("poisson", 200, 20, parse_sizes("short:0.75,long:0.25"), seed=1)
    share = np.mean([r.label == "short" for r in reqs])
    assert share == pytest.approx(0.75, abs=0.03)
    with pytest.raises(LoadSpecError):
        generate("closed", 1, 1, parse_sizes(None))


# ------------------------------------------------------------------------------------ server
def _reqs(times, values=None):
    values = values or [1] * len(times)
    return [Request(i, t, str(v), v) for i, (t, v) in enumerate(zip(times, values))]


def test_fifo_queueing_under_a_known_arrival_sequence():
    clock = SimClock()
    fake = FakeRunner(clock, service_s=lambda b, s=None: 0.010)
    res = serve(fake, clock, _reqs([0, 0, 0, 0.05]), BatchPolicy(max_batch=1, max_wait_s=0))
    assert res.status == ["ok"] * 4
    np.testing.assert_allclose(res.start, [0, 0.01, 0.02, 0.05])
    np.testing.assert_allclose(res.finish - res.arrival, [0.01, 0.02, 0.03, 0.01])
    s = res.summary()
    assert s["latency"]["p50_ms"] == pytest.approx(15)
    assert s["queue_wait"]["max_ms"] == pytest.approx(20)
    assert s["utilization"] == pytest.approx(0.04 / 0.06)
    assert s["batch_histogram"] == {"1": 4}


def test_max_wait_holds_a_batch_open_until_full_or_deadline():
    clock = SimClock()
    fake = FakeRunner(clock, service_s=lambda b, s=None: 0.001 * b)
    res = serve(fake, clock, _reqs([0, 0.002]), BatchPolicy(max_batch=2, max_wait_s=0.005))
    np.testing.assert_allclose(res.start, [0.002, 0.002])  # full at the 2nd arrival
    assert res.batches == [(pytest.approx(0.002), pytest.approx(0.004), 2, 2)]
    clock = SimClock()
    fake = FakeRunner(clock, service_s=lambda b, s=None: 0.001 * b)
    res = serve(fake, clock, _reqs([0, 0.002, 0.009]), BatchPolicy(max_batch=4, max_wait_s=0.005))
    # the first two go at the oldest one's deadline (5 ms); the third arrives after and runs
    # alone as soon as nothing more is scheduled
    np.testing.assert_allclose(res.start, [0.005, 0.005, 0.009])
    assert [b[2] for b in res.batches] == [2, 1]


def test_requests_of_many_items_fill_batches_by_items():
    clock = SimClock()
    fake = FakeRunner(clock, service_s=lambda b, s=None: 0.001)
    res = serve(fake, clock, _reqs([0, 0, 0], [3, 4, 2]), BatchPolicy(max_batch=8, max_wait_s=0))
    assert [(b[2], b[3]) for b in res.batches] == [(7, 2), (2, 1)]
    assert fake.calls == [(7, None), (2, None)]


def test_size_dim_requests_batch_only_with_equal_sizes():
    clock = SimClock()
    fake = FakeRunner(clock, service_s=lambda b, s=None: 0.001)
    res = serve(fake, clock, _reqs([0, 0, 0, 0], [32, 128, 32, 128]),
                BatchPolicy(max_batch=8, max_wait_s=0), size_is_items=False)
    assert fake.calls == [(2, 32), (2, 128)]
    assert res.summary()["by_size"].keys() == {"32", "128"}


def test_full_queue_drops_and_long_waits_time_out():
    clock = SimClock()
    fake = FakeRunner(clock, service_s=lambda b, s=None: 0.100)
    res = serve(fake, clock, _reqs([0, 0.01, 0.02, 0.03]),
                BatchPolicy(max_batch=1, max_wait_s=0, max_queue=2, timeout_s=0.15))
    # t=0: #0 starts (busy to 0.1); #1, #2 queue; #3 finds the queue full. At 0.1 #1 starts
    # (waited 0.09); at 0.2 #2 has waited 0.18 > 0.15: timed out.
    assert res.status == ["ok", "ok", "timed_out", "dropped"]
    s = res.summary()
    assert (s["completed"], s["dropped"], s["timed_out"]) == (2, 1, 1)
    assert s["overloaded"] and s["max_queue_depth"] == 2


def test_overload_grows_the_queue_and_batching_raises_throughput():
    # 10 ms fixed + 1 ms per item; a request every 5 ms (200/s) for 2 s.
    times = np.arange(400) * 0.005
    policy1 = BatchPolicy(max_batch=1, max_wait_s=0, timeout_s=None)
    policy8 = BatchPolicy(max_batch=8, max_wait_s=0.005, timeout_s=None)
    out = {}
    for name, policy in (("b1", policy1), ("b8", policy8)):
        clock = SimClock()
        fake = FakeRunner.linear(clock, fixed_s=0.010, per_item_s=0.001)
        out[name] = serve(fake, clock, _reqs(times), policy, drain_s=100, duration=2.0).summary()
    b1, b8 = out["b1"], out["b8"]
    # batch 1: capacity 1/11 ms = 90.9/s < 200/s offered -> the queue grows without bound
    assert b1["completed"] == 400
    assert b1["achieved_rate"] == pytest.approx(400 / (400 * 0.011))
    assert b1["utilization"] == pytest.approx(1.0)
    assert b1["queueing_growth"]["growing"]
    assert b1["latency"]["max_ms"] == pytest.approx(400 * 11 - 399 * 5)
    assert b1["overloaded"] and b1["max_queue_depth"] > 150
    # batch 8: capacity 8/18 ms = 444/s: keeps up, latency flat, 2.2x the throughput
    assert not b8["queueing_growth"]["growing"]
    assert b8["achieved_rate"] > 2 * b1["achieved_rate"]
    assert b8["latency"]["p99_ms"] < 30
    assert b8["mean_batch_items"] > 1
    assert not b8["overloaded"] and b8["max_queue_depth"] <= 8


def test_drain_horizon_bounds_the_test():
    clock = SimClock()
    fake = FakeRunner(clock, service_s=lambda b, s=None: 1.0)
    res = serve(fake, clock, _reqs([0] * 10), BatchPolicy(max_batch=1, max_wait_s=0,
                                                             timeout_s=None), drain_s=2.5)
    # batches start at 0, 1 and 2 s; at 3 s the 2.5 s horizon has passed: the rest time out
    assert res.status.count("ok") == 3 and res.status.count("timed_out") == 7
    assert clock.now() == pytest.approx(3.0)


def test_real_clock_server_serves_everything_through_the_client_thread():
    # the threaded path with a real clock: only counts and orderings are checked, no timings
    from tvmopt.bench.clock import RealClock

    clock = RealClock()
    fake = FakeRunner(clock, service_s=lambda b, s=None: 0.001)
    reqs = _reqs(list(np.linspace(0, 0.2, 20)))
    res = serve(fake, clock, reqs, BatchPolicy(max_batch=4, max_wait_s=0.002, timeout_s=None),
                drain_s=30)
    assert res.status == ["ok"] * 20
    assert sum(b[3] for b in res.batches) == 20
    assert np.all(res.start >= res.arrival) and np.all(res.finish > res.start)
