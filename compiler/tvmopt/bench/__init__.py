"""`tvmopt bench`: latency/throughput harness (closed loop, batch sweeps, baselines, open-loop
load with dynamic batching, cold start, memory, per-kernel profile, soak).

Timing logic never reads the wall clock directly: it takes a `Clock` and a `Runner`, so the fake
runner with a simulated clock reproduces every figure exactly in tests.
"""
