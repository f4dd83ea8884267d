"""Open-loop request generation: Poisson and burst arrivals, and a request-size mix.

Everything is drawn from a seeded numpy Generator up front, so a load test is a fixed list of
(arrival time, size) pairs: reproducible, and identical across runners.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import TvmoptError

# Bound on one load test's requests: a typo such as --rate 1e6 should fail, not fill memory.
MAX_REQUESTS = 200_000
# Named sizes map to these values (batch items, or the model's sequence dim when it has one).
DEFAULT_SIZE_VALUES = {"short": 1, "medium": 4, "long": 16}


class LoadSpecError(TvmoptError):
    """A --load / --rate / --burst / --sizes value that cannot be used."""


@dataclass(frozen=True)
class Request:
    """One request: arrival offset from the start of the test, and its size."""

    id: int
    t: float
    label: str
    value: int  # items (batch samples), or the size dim's value


@dataclass(frozen=True)
class SizeClass:
    label: str
    value: int
    prob: float


def parse_sizes(spec: str | None) -> list[SizeClass]:
    """Parse 'short:0.6,medium:0.3,long:0.1' (or '8:0.5,32:0.5' with explicit values).

    'short', 'medium', 'long' take DEFAULT_SIZE_VALUES; 'NAME=VALUE:P' sets a value. Ratios
    are normalized to sum to 1.

    Raises:
        LoadSpecError: naming the bad entry.
    """
    if not spec:
        return [SizeClass("1", 1, 1.0)]
    out = []
    for entry in spec.split(","):
        entry = entry.strip()
        if ":" not in entry:
            raise LoadSpecError(f"--sizes entry '{entry}': expected NAME:RATIO "
                                "(e.g. short:0.6,medium:0.3,long:0.1)")
        name, ratio = entry.rsplit(":", 1)
        if "=" in name:
            name, val = name.split("=", 1)
        elif name in DEFAULT_SIZE_VALUES:
            val = DEFAULT_SIZE_VALUES[name]
        else:
            val = name
        try:
            value, prob = int(val), float(ratio)
        except ValueError:
            raise LoadSpecError(f"--sizes entry '{entry}': size must be an integer or one of "
                                f"{', '.join(DEFAULT_SIZE_VALUES)}; ratio a number") from None
        if value < 1 or prob <= 0:
            raise LoadSpecError(f"--sizes entry '{entry}': size and ratio must be positive")
        out.append(SizeClass(name, value, prob))
    total = sum(s.prob for s in out)
    return [SizeClass(s.label, s.value, s.prob / total) for s in out]


def parse_burst(spec: str | None, rate: float, duration: float) -> list[tuple[float, float]]:
    """Burst phases as (seconds, rate) pairs: 'RATE:SECONDS,RATE:SECONDS,...'.

    Without a spec: `rate` for the first third, 4x `rate` for the middle third, `rate` again.
    """
    if not spec:
        third = duration / 3
        return [(third, rate), (third, 4 * rate), (duration - 2 * third, rate)]
    phases = []
    for entry in spec.split(","):
        try:
            r, s = entry.split(":")
            phases.append((float(s), float(r)))
        except ValueError:
            raise LoadSpecError(f"--burst entry '{entry}': expected RATE:SECONDS "
                                "(e.g. 10:5,50:5,10:5)") from None
        if phases[-1][0] <= 0 or phases[-1][1] < 0:
            raise LoadSpecError(f"--burst entry '{entry}': seconds must be > 0 and rate >= 0")
    return phases


def _check_count(expected: float) -> None:
    if expected > MAX_REQUESTS:
        raise LoadSpecError(f"the load would issue ~{expected:.0f} requests, over the limit of "
                            f"{MAX_REQUESTS}; lower --rate or --duration")


def poisson_arrivals(rate: float, duration: float, rng: np.random.Generator,
                     start: float = 0.0) -> np.ndarray:
    """Arrival times of a Poisson process of `rate`/s on [start, start + duration)."""
    if rate <= 0 or duration <= 0:
        if rate < 0 or duration < 0:
            raise LoadSpecError(f"rate ({rate}) and duration ({duration}) must not be negative")
        return np.empty(0)
    _check_count(rate * duration)
    # draw exponential gaps in chunks until past the end: bounded by MAX_REQUESTS above
    n = int(rate * duration + 6 * np.sqrt(rate * duration) + 10)
    t = start + np.cumsum(rng.exponential(1.0 / rate, n))
    while t[-1] < start + duration:
        t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1.0 / rate, n))])
    return t[t < start + duration]


def burst_arrivals(phases: list[tuple[float, float]], rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals whose rate steps through `phases` [(seconds, rate), ...]."""
    _check_count(sum(s * r for s, r in phases))
    out, t0 = [], 0.0
    for seconds, rate in phases:
        out.append(poisson_arrivals(rate, seconds, rng, start=t0))
        t0 += seconds
    return np.concatenate(out) if out else np.empty(0)


def make_requests(times, sizes: list[SizeClass], rng: np.random.Generator) -> list[Request]:
    """Attach a size drawn from the mix to each arrival time."""
    idx = rng.choice(len(sizes), size=len(times), p=[s.prob for s in sizes])
    return [Request(i, float(t), sizes[k].label, sizes[k].value)
            for i, (t, k) in enumerate(zip(times, idx))]


def generate(kind: str, rate: float, duration: float, sizes: list[SizeClass],
             burst: str | None = None, seed: int = 0) -> list[Request]:
    """The full request list for `--load KIND`.

    Raises:
        LoadSpecError: unknown kind or bad numbers.
    """
    rng = np.random.default_rng(seed)
    if kind == "poisson":
        times = poisson_arrivals(rate, duration, rng)
    elif kind == "burst":
        times = burst_arrivals(parse_burst(burst, rate, duration), rng)
    else:
        raise LoadSpecError(f"unknown --load '{kind}' (choose poisson or burst)")
    return make_requests(times, sizes, rng)
