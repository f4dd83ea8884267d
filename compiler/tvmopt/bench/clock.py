"""Clocks the harness reads time from: the real monotonic clock, or a simulated one for tests."""

from __future__ import annotations

import time


class RealClock:
    """`time.perf_counter`, in seconds; `sleep` really sleeps."""

    simulated = False

    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class SimClock:
    """A clock that only moves when told to: `sleep` (or a fake runner's work) advances it."""

    simulated = True

    def __init__(self, start: float = 0.0):
        self.t = float(start)

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.t += seconds

    def advance_to(self, t: float) -> None:
        self.t = max(self.t, float(t))
