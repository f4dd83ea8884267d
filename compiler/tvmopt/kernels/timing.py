"""Timing built kernels on this host: the one measurement module of the compile-time choices.

The per-kernel dispatch (kernels.dispatch), the tuned-record check (tuning.prefer) and the task
ranking of `tune --tasks slowest:N` (tuning.select) all time a kernel the same way: random
inputs for its parameters, a warm-up call, then the best of several batched samples. A sample
is only as good as the machine was quiet while it ran, so each measurement also reports the CPU
time other processes used meanwhile (foreign load) and how far its samples spread; a
measurement that stays loaded or noisy after re-timing is returned untrusted, and the timing
cache refuses to store it, so one compile on a busy machine cannot fix a bad choice for every
later compile.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..files import cache_root

CACHE_NAME = "dispatch-timings.json"
# Changes when the way kernels are timed changes, so older cached timings are not reused.
TIMING_METHOD = "both-sides-on-the-openmp-team"
# A measurement is trusted when other processes used less than this share of one core while it
# ran, and its median sample is within SPREAD of its best one.
FOREIGN_LOAD_LIMIT = 0.25
SPREAD = 1.3
RETRIES = 2  # re-timings of an untrusted measurement before it is returned as it is


def host_id() -> str:
    """The CPU model name (cached timings are only valid on the CPU that measured them)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                        "")
    except OSError:
        return ""


def threads() -> str:
    return os.environ.get("TVM_NUM_THREADS", str(os.cpu_count()))


@functools.lru_cache(maxsize=1)
def codegen_id() -> str:
    """A hash of the code that decides what the codegen side compiles to (the default
    schedules, the pipeline, its passes): a timing measured before they changed is stale."""
    pkg = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in sorted([*pkg.joinpath("kernels").glob("*.py"), pkg / "pipeline.py",
                     *pkg.joinpath("passes").glob("*.py")]):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_key(kernel: str, target_text: str, ext_id: str) -> str:
    """The timing cache's key of `kernel` (any text naming what is timed) on this host."""
    import tvm

    text = "\n".join([kernel, target_text, tvm.__version__, ext_id, codegen_id(), host_id(),
                      threads(), TIMING_METHOD])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


# A symbolic dim is timed at its upper bound, capped so a kernel's symbolic dims multiply to at
# most this many (rows of a dense layer): large enough for the library's blocking to show, small
# enough that a timing stays short.
SYMBOLIC_ROWS = 512


def timing_dims(func, bounds: dict[str, tuple[int, int]]) -> dict[str, int]:
    """The value each symbolic dim of `func`'s params is timed at: its upper bound from
    `bounds` (name -> (lo, hi)), halved, largest first, while their product exceeds
    SYMBOLIC_ROWS (never below the lower bound)."""
    from tvm import relax

    names = sorted({v.name for p in func.params
                    for v in relax.analysis.tir_vars_in_type(p.ty)})
    lo = {n: max(bounds.get(n, (1, 0))[0], 1) for n in names}
    values = {n: max(bounds.get(n, (1, SYMBOLIC_ROWS))[1], lo[n]) for n in names}
    while int(np.prod([1, *values.values()])) > SYMBOLIC_ROWS:
        shrinkable = [n for n in names if values[n] > lo[n]]
        if not shrinkable:
            break
        n = max(shrinkable, key=values.get)
        values[n] = max(values[n] // 2, lo[n])
    return values


def dim_value(expr, dims: dict[str, int], unknown: set[str] | None = None) -> int:
    """An integer shape expression with its symbolic dims taken from `dims`.

    A var missing from `dims` is an error, unless `unknown` is given: it then counts as 1 and
    its name is added to `unknown` (a size only known at run time, e.g. NonZero's count).
    """
    from tvm import tirx
    from tvm.sym import Analyzer

    if isinstance(expr, int):
        return expr
    if hasattr(expr, "value"):
        return int(expr.value)
    analyzer = Analyzer()
    for var in tirx.analysis.undefined_vars(expr):
        if var.name not in dims:
            if unknown is None:
                raise KeyError(f"symbolic dim {var.name} has no value")
            unknown.add(var.name)
        # a scalar tirx.Var carries its dtype in its type (`.dtype` is for buffer vars)
        dtype = str(getattr(var.ty, "dtype", "int64"))
        analyzer.bind(var, tirx.const(int(dims.get(var.name, 1)), dtype))
    try:
        value = analyzer.simplify(expr)
    except Exception:  # noqa: BLE001 - TVM's const folder refuses a division by zero
        # The sizes picked do not make a valid shape of this expression (a length divided by
        # another length that is 0 for so short an input): no number for it here.
        value = None
    if hasattr(value, "value"):
        return int(value.value)
    if unknown is None:
        raise ValueError(f"shape {expr} does not reduce to a number at {dims}")
    unknown.add(str(expr))
    return 1


def random_inputs(func, rng, dims: dict[str, int] | None = None) -> list[np.ndarray]:
    """Arrays for a Relax function's or PrimFunc's tensor params (symbolic dims from `dims`):
    floats normal, integers 0 (an index in range for every gather); a shape param's values."""
    import tvm_ffi
    from tvm import relax

    out = []
    for p in func.params:
        ty = p.ty
        if isinstance(ty, relax.ShapeType):  # the symbolic dims a fused function is passed
            out.append(tvm_ffi.Shape([dim_value(d, dims or {}) for d in ty.values]))
            continue
        shape = [dim_value(d, dims or {}) for d in getattr(ty.shape, "values", ty.shape)]
        dtype = str(ty.dtype)
        out.append(rng.standard_normal(shape).astype(dtype) if dtype.startswith("float")
                   else np.zeros(shape, dtype=dtype))
    return out


@dataclass(frozen=True)
class Measurement:
    """One kernel's timing on this host.

    Attributes:
        ms: the best sample (other processes and the other runtime's pool only add time).
        median_ms: the median sample.
        foreign_load: cores' worth of CPU time other processes used while it was measured.
        attempts: how many times it was measured (re-timed while untrusted).
    """

    ms: float
    median_ms: float
    foreign_load: float
    attempts: int = 1

    @property
    def trusted(self) -> bool:
        return self.foreign_load < FOREIGN_LOAD_LIMIT and self.median_ms <= SPREAD * self.ms

    def why_untrusted(self) -> str:
        if self.foreign_load >= FOREIGN_LOAD_LIMIT:
            return f"other processes used {self.foreign_load:.2f} cores while it was timed"
        return f"samples spread from {self.ms:.4g} to {self.median_ms:.4g} ms (median)"


def _busy_seconds() -> tuple[float, float]:
    """(CPU seconds all processes have used, CPU seconds this process has used)."""
    import psutil

    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    me = psutil.Process().cpu_times()
    return busy, me.user + me.system


def _sample(f, inputs) -> tuple[float, float, float]:
    """(best ms, median ms, foreign load) of five batched samples of ~6 ms each."""
    f(*inputs)  # first call: oneDNN reorders its weights then; not a steady-state cost
    t0 = time.perf_counter()
    f(*inputs)
    one = max(time.perf_counter() - t0, 1e-6)
    number = max(1, min(200, int(0.006 / one)))
    samples = []
    busy0, me0 = _busy_seconds()
    w0 = time.perf_counter()
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(number):
            f(*inputs)
        samples.append((time.perf_counter() - t0) / number)
    wall = max(time.perf_counter() - w0, 1e-9)
    busy1, me1 = _busy_seconds()
    foreign = max(0.0, (busy1 - busy0) - (me1 - me0)) / wall
    return float(np.min(samples) * 1e3), float(np.median(samples) * 1e3), foreign


def measure_call(vm, name: str, inputs) -> Measurement:
    """Time `vm[name](*inputs)`, re-timing up to RETRIES times while the machine is loaded or
    the samples spread; the best of the attempts is returned (trusted or not)."""
    f = vm[name]
    best = None
    for attempt in range(1, RETRIES + 2):
        ms, med, foreign = _sample(f, inputs)
        m = Measurement(ms, med, foreign, attempt)
        if best is None or (m.trusted, -m.ms) > (best.trusted, -best.ms):
            best = m
        if m.trusted:
            break
    return Measurement(best.ms, best.median_ms, best.foreign_load, attempt)


def time_call(vm, name: str, inputs, dev=None) -> float:
    """Best ms of `vm[name](*inputs)` (see measure_call)."""
    return measure_call(vm, name, inputs).ms


class TimingCache:
    """A JSON file of measured kernel timings; unreadable or foreign entries are ignored.

    Args:
        path: the file (default: dispatch-timings.json in the cache root).
        read: False ignores what the file holds (`compile --retime`); new timings still
            replace the old ones when saved.
    """

    def __init__(self, path: Path | None = None, read: bool = True):
        self.path = path or cache_root() / CACHE_NAME
        self.data = {}
        try:
            data = json.loads(self.path.read_text())
            if isinstance(data, dict):
                self.data = data
        except (OSError, ValueError):
            pass
        self.read = read

    def get(self, key: str, fields=("library_ms", "codegen_ms")):
        v = self.data.get(key) if self.read else None
        ok = isinstance(v, dict) and set(fields) <= set(v)
        return tuple(v[f] for f in fields) if ok else None

    def put(self, key: str, kernel: str, **fields) -> None:
        self.data[key] = {"kernel": kernel, **fields}

    def save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.data, indent=0, sort_keys=True))
            os.replace(tmp, self.path)  # atomic: two compiles at once never corrupt it
        except OSError:
            pass  # a read-only home only costs a re-timing next time
