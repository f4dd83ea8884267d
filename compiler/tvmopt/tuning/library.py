"""The kernels tune leaves to oneDNN, and what they put out of tuning's reach.

A build whose convolutions and matmuls run on oneDNN gives the search only what stays codegen.
Two bounds follow, both reported by `tvmopt tune`:

- the floor: were the tuned kernels free, the build would still take the library's time;
- the rate: how near the library's calls already run to the best rate oneDNN reaches on this
  host (a large matmul in the same precision, timed by the dispatch as any workload is). Calls
  at that rate leave nothing to win for any schedule search, nor for a better library kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

# The probe's matmul: large enough that oneDNN runs it at the cores' multiply-add rate, small
# enough to time in about a second (its fp32, bf16 and codegen sides together).
PROBE_SHAPE = (512, 1024, 1024)  # M, K, N


@dataclass
class LibraryTime:
    """The kernels a library (oneDNN) runs in the tuned module: tuning does not change them,
    so they bound what it can buy."""

    calls: int  # call sites per inference
    ms: float  # per inference, over the calls the dispatch timed
    untimed: int  # calls with no timing (a forced --dispatch, a run-time sequence length)
    gflop: float | None = None  # per inference over the timed calls; None: a call's is unknown
    # The timed calls' time were each at the probe's rate for its precision (None: unknown).
    at_probe_ms: float | None = None
    probe: dict | None = None  # {precision: GFLOP/s} the probe measured on this host

    @property
    def gflops(self) -> float | None:
        """The library calls' rate as run: their FLOPs over their time."""
        if self.gflop is None or self.ms <= 0:
            return None
        return self.gflop / self.ms * 1e3

    @property
    def of_probe(self) -> float | None:
        """Their time at the probe's rates as a share of their time as run: 1.0 runs them as
        fast as oneDNN's best here (TVM counts a convolution's padding taps, which oneDNN
        skips, so a padded convolution at the cores' rate reads a little over 1)."""
        if self.at_probe_ms is None or self.ms <= 0:
            return None
        return self.at_probe_ms / self.ms


def per_call_ms(c) -> float | None:
    """A library call's timed ms at the precision it runs (None: untimed)."""
    return c.library_bf16_ms if c.precision == "bf16" else c.library_ms


def recorded_library_ms(choices, manifest: dict) -> None:
    """Give the library calls a resumed run took as recorded (untimed) the times the database
    recorded for them."""
    recorded = manifest.get("library_ms") or {}
    for c in choices:
        if c.choice == "library" and per_call_ms(c) is None and c.kernel in recorded:
            if c.precision == "bf16":
                c.library_bf16_ms = recorded[c.kernel]
            else:
                c.library_ms = recorded[c.kernel]


def library_time(choices, probe: dict | None = None) -> LibraryTime | None:
    """Per-inference time of the library calls, as the dispatch timed each at the precision
    it runs, with their FLOPs and, given the probe's {precision: GFLOP/s}, their time at those
    rates; None when there are none."""
    calls, ms, untimed = 0, 0.0, 0
    gflop, at_probe = 0.0, 0.0
    for c in choices:
        if c.choice != "library":
            continue
        calls += c.sites
        per_call = per_call_ms(c)
        if per_call is None:
            untimed += c.sites
            continue
        ms += per_call * c.sites
        rate = (probe or {}).get(c.precision)
        if gflop is not None:
            gflop = None if c.gflop is None else gflop + c.gflop * c.sites
        if at_probe is not None:
            at_probe = (None if c.gflop is None or not rate
                        else at_probe + c.gflop * c.sites / rate * 1e3)
    if not calls:
        return None
    timed = calls > untimed
    return LibraryTime(calls, ms, untimed, gflop if timed else None,
                       at_probe if timed and probe else None, probe or None)


def ceiling(library: LibraryTime | None, default_s: float | None) -> tuple[float, float] | None:
    """(share of the timed kernel time the tuned kernels hold, the lowest latency tuning can
    reach as a fraction of the untuned one, were the tuned kernels free), or None when the
    library is untimed or there is nothing to compare."""
    if library is None or library.untimed or default_s is None:
        return None
    total = library.ms / 1e3 + default_s
    if total <= 0:
        return None
    return default_s / total, library.ms / 1e3 / total


def probe_rates(hw, compute: tuple[str, ...]) -> dict[str, float]:
    """{precision: GFLOP/s} oneDNN reaches on this host on PROBE_SHAPE's matmul, for each of
    `compute` ("fp32", "bf16") the dispatch timed and trusted. Timed through the dispatch, as
    any workload is, and again on every call (a second or two): a rate read from the cache
    would be some earlier run's, which a busy moment may have halved. Empty where the
    dispatch does not run (not x86, no extension)."""
    import numpy as np
    from tvm import relax

    from .. import pipeline

    m, k, n = PROBE_SHAPE
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    with bb.function("main", [x]):
        w = relax.const(np.random.default_rng(0).standard_normal((k, n)).astype("float32"))
        with bb.dataflow():
            y = bb.emit_output(bb.emit(relax.op.matmul(x, w)))
        bb.emit_func_output(y)
    cfg = pipeline.PipelineConfig(dispatch="auto", hw=hw, library_compute=tuple(compute),
                                  retime=True)
    with pipeline.unrecorded():  # a measurement, not the caller's pipeline
        records = pipeline.optimize(bb.get(), hw.to_tvm(), cfg, until=pipeline.FRONT_HALF).records
    flop = 2.0 * m * k * n
    out = {}
    for c in records.choices:
        if not c.trusted:
            continue
        for prec, ms in (("fp32", c.library_ms), ("bf16", c.library_bf16_ms)):
            if prec in compute and ms:
                out[prec] = max(out.get(prec, 0.0), flop / ms / 1e6)
    return out
