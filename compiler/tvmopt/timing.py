"""Timing built kernels on this host: the one measurement module of the compile-time choices.

The per-kernel dispatch (precision.choice), the tuned-record check (tuning.prefer) and the task
ranking of `tune --tasks slowest:N` (tuning.select) all time a kernel the same way: random
inputs for its parameters, a warm-up call, then the best of several batched samples. A sample
is only as good as the machine was quiet while it ran, so each measurement also reports the CPU
time other processes used meanwhile (foreign load) and how far its samples spread; a
measurement that stays loaded or noisy after re-timing is returned untrusted, and the timing
cache refuses to store it, so one compile on a busy machine cannot fix a bad choice for every
later compile.

A measurement is also checked against the roofline of this host (`Roof`): a kernel cannot run
faster than its FLOPs at the host's peak allow, so a sample under that floor did not measure
the kernel's work; and a library kernel far above its roofline time was slowed by something the
load figure missed (a burst in another VM on the same cores), so it is re-timed, and not cached
if it stays there.
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

from .files import cache_root

CACHE_NAME = "dispatch-timings.json"
# Changes when the way kernels are timed changes, so older cached timings are not reused.
TIMING_METHOD = "both-sides-on-the-openmp-team"
# A measurement is trusted when other processes used less than this share of one core while it
# ran, and its median sample is within SPREAD of its best one.
FOREIGN_LOAD_LIMIT = 0.25
SPREAD = 1.3
RETRIES = 2  # re-timings of an untrusted measurement before it is returned as it is
# Rounds of `measure_paired`, and the batched samples each side takes per round.
PAIR_ROUNDS = 7
PAIR_BATCHES = 3
# The host's peaks are at the reference part's base clock; a core in turbo runs up to this much
# faster, so the floor divides by it.
TURBO = 2.0
# A library kernel slower than this many floors, plus a call's fixed cost, is not trusted:
# oneDNN reaches a good share of peak on the shapes it is given, and what remains between it and
# the floor is memory traffic the whole-socket bandwidth figure understates on a slice of a host.
CEILING_FLOORS = 100.0
CEILING_FIXED_MS = 0.2


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


def start_tvm_pool() -> bool:
    """Start TVM's thread pool in this process at `threads()`; False when it had already
    started at another count.

    The pool reads TVM_NUM_THREADS once, when it starts, and otherwise takes half the logical
    CPUs (one thread on a 2-vCPU machine), while an artifact runs on every core
    (runtime.loader) and the library side of the dispatch runs oneDNN's team at `threads()`.
    A kernel timed on TVM's pool (a tuned record against its default schedule, a task's
    ranking) is only the artifact's time when the pool is that size; timings from a pool of
    another size are not for the cache.
    """
    import tvm

    want = os.environ.setdefault("TVM_NUM_THREADS", threads())
    return not want.isdigit() or tvm.runtime.num_threads() == int(want)


@functools.lru_cache(maxsize=1)
def codegen_id() -> str:
    """A hash of the code that decides what the codegen side compiles to (the default
    schedules, the pipeline, its passes, the recurrent loop kernels): a timing measured before
    they changed is stale."""
    pkg = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted([*pkg.joinpath("codegen").glob("*.py"), pkg / "pipeline.py",
                     *pkg.joinpath("passes").glob("*.py"),
                     pkg / "frontend" / "onnx_ops" / "rnn_loop.py"]):
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


def distinct_dim_names(func):
    """`func` with each of its symbolic dims under a name no other one has.

    Dims are given values by name (timing_dims, dim_value), but TVM's passes make distinct vars
    of one name: every shape read back from a tensor at run time (a Pad or Reshape whose sizes
    are computed) defines fresh vars all called `x`. One value for all of them is no value of
    the kernel: a window partition's rows `x * (x / 4) * (x / 4) * x // 24` became 179 million
    at x = 512. The first var keeps its name (a model's `batch` stays `batch`), later ones get
    `name_1`, `name_2`, ...
    """
    from tvm import relax, tirx

    # In the order the params show them, then the body's own.
    found = [*(v for p in func.params for v in relax.analysis.tir_vars_in_type(p.ty)),
             *relax.analysis.defined_symbolic_vars(func),
             *relax.analysis.free_symbolic_vars(func)]
    taken, owner, rename = {v.name for v in found}, {}, {}
    for v in found:
        if owner.setdefault(v.name, v).same_as(v):
            continue
        k = 1
        while f"{v.name}_{k}" in taken:
            k += 1
        taken.add(f"{v.name}_{k}")
        rename[v] = tirx.Var(f"{v.name}_{k}", v.ty)
    return func.bind_symbolic_vars(rename) if rename else func


def timing_dims(func, bounds: dict[str, tuple[int, int]], image: bool = False) -> dict[str, int]:
    """The value each symbolic dim of `func`'s params is timed at: its upper bound from
    `bounds` (name -> (lo, hi)), halved, largest first, while the kernel's rows exceed
    SYMBOLIC_ROWS (never below the lower bound).

    A tensor's rows are the product of its symbolic dims (batch * seq of a dense layer's
    input), the kernel's the most of any param or result (dims it is only passed as values
    count as one tensor's). A dim is not halved where that would leave a tensor with no rows:
    a dim read back from a run-time shape and divided (`x * (x / 4) * (x / 4) * x // 24`, a
    window partition) would otherwise be timed empty.

    With `image` (a convolution), a tensor with a symbolic dim counts its static dims too, all
    but the channels (its GEMM rows: batch x pixels): a 48x48 feature map is 2304 rows an
    image, and a batch of SYMBOLIC_ROWS images would time a workload no deployment runs."""
    from tvm import relax, tirx

    names = sorted({v.name for p in func.params
                    for v in relax.analysis.tir_vars_in_type(p.ty)})
    lo = {n: max(bounds.get(n, (1, 0))[0], 1) for n in names}
    values = {n: max(bounds.get(n, (1, SYMBOLIC_ROWS))[1], lo[n]) for n in names}
    tensors = [*[p.ty for p in func.params], func.ret_ty]
    tensors = [t for ty in tensors for t in (ty.fields if isinstance(ty, relax.TupleType)
                                             else [ty])]
    shapes = [list(getattr(getattr(t, "shape", None), "values", None) or []) for t in tensors]
    symbolic = [(dims[:-1] if image else [d for d in dims if not hasattr(d, "value")])
                for dims in shapes if any(not hasattr(d, "value") for d in dims)]
    # Dims only passed to the kernel as values (its body shapes tensors with them) count
    # together, as one more tensor's.
    shaped = {v.name for dims in symbolic for d in dims for v in tirx.analysis.undefined_vars(d)}
    passed = {v.name: v for p in func.params if isinstance(p.ty, relax.ShapeType)
              for v in relax.analysis.tir_vars_in_type(p.ty) if v.name not in shaped}
    if passed:
        symbolic.append(list(passed.values()))
    # A var of a result that no param defines (a size known only at run time) counts as 1.
    ones = {v.name: 1 for dims in symbolic for d in dims for v in tirx.analysis.undefined_vars(d)}

    def size(d, vals):
        try:
            return dim_value(d, {**ones, **vals})
        except ValueError:  # no value: a divisor at 0
            return 0

    def sizes(vals):
        return [[size(d, vals) for d in dims] for dims in symbolic]

    def rows(vals):
        return max([1, *(int(np.prod(s)) for s in sizes(vals))])

    held: set[str] = set()
    while rows(values) > SYMBOLIC_ROWS:
        shrinkable = [n for n in names if values[n] > lo[n] and n not in held]
        if not shrinkable:
            break
        n = max(shrinkable, key=values.get)
        before = values[n]
        values[n] = max(before // 2, lo[n])
        if any(v < 1 for s in sizes(values) for v in s):
            values[n] = before
            held.add(n)
    return values


def dim_value(expr, dims: dict[str, int], unknown: set[str] | None = None) -> int:
    """An integer shape expression with its symbolic dims taken from `dims`.

    A var missing from `dims` is an error, unless `unknown` is given: it then counts as 1 and
    its name is added to `unknown` (a size only known at run time, e.g. NonZero's count). So is
    an expression that has no value there (a division by a dim that is 0 at these values): the
    whole expression then counts as 1.
    """
    from tvm import tirx
    from tvm.error import InternalError
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
    except InternalError:  # TVM's "Divide by zero" check: a divisor is 0 at these values
        value = None
    if hasattr(value, "value"):
        return int(value.value)
    if unknown is None:
        raise ValueError(f"shape {expr} does not reduce to a number at "
                         f"{', '.join(f'{k}={v}' for k, v in dims.items()) or 'these dims'}")
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
class Roof:
    """What one kernel's time may be on this host: at least `floor_ms` (its FLOPs at the host's
    peak for its precision), and for a library kernel at most `ceiling_ms`."""

    floor_ms: float
    ceiling_ms: float | None = None

    def holds(self, ms: float) -> bool:
        return ms >= self.floor_ms and (self.ceiling_ms is None or ms <= self.ceiling_ms)

    def why(self, ms: float) -> str:
        if ms < self.floor_ms:
            return (f"{ms:.4g} ms is under the roofline floor of {self.floor_ms:.4g} ms: the "
                    "timed call did not do the kernel's work")
        return (f"{ms:.4g} ms is over {CEILING_FLOORS:g}x the roofline floor of "
                f"{self.floor_ms:.4g} ms for a library kernel")


def roof(flops: float, nbytes: float, peak_gflops_per_core: float | None,
         bandwidth_gbs: float | None, library: bool) -> Roof | None:
    """The Roof of a kernel doing `flops` and moving `nbytes` on the `threads()` cores it is
    timed on, or None when the host's figures or the kernel's FLOPs are unknown.

    The floor is the FLOPs alone: a kernel timed in a loop keeps its operands in cache, which
    feeds the cores faster than the memory bandwidth figure, so bytes only raise the ceiling."""
    if not peak_gflops_per_core or flops <= 0:
        return None
    cores = int(threads()) if threads().isdigit() else 1
    floor_ms = flops / (peak_gflops_per_core * 1e9 * max(1, cores) * TURBO) * 1e3
    if not library:
        return Roof(floor_ms)
    memory_ms = nbytes / (bandwidth_gbs * 1e9) * 1e3 if bandwidth_gbs else 0.0
    return Roof(floor_ms, CEILING_FLOORS * max(floor_ms, memory_ms) + CEILING_FIXED_MS)


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
    roof: Roof | None = None

    @property
    def trusted(self) -> bool:
        return (self.foreign_load < FOREIGN_LOAD_LIMIT and self.median_ms <= SPREAD * self.ms
                and (self.roof is None or self.roof.holds(self.ms)))

    def why_untrusted(self) -> str:
        if self.foreign_load >= FOREIGN_LOAD_LIMIT:
            return f"other processes used {self.foreign_load:.2f} cores while it was timed"
        if self.median_ms > SPREAD * self.ms:
            return f"samples spread from {self.ms:.4g} to {self.median_ms:.4g} ms (median)"
        return self.roof.why(self.ms) if self.roof is not None else ""


def _busy_seconds(children: bool = False) -> tuple[float, float]:
    """(CPU seconds all processes have used, CPU seconds this process has used, with its
    running children's when `children`: worker processes timed alongside it)."""
    import psutil

    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    proc = psutil.Process()
    mine = [proc] + (proc.children(recursive=True) if children else [])
    own = 0.0
    for p in mine:
        try:
            c = p.cpu_times()
        except psutil.Error:  # a child that has just exited
            continue
        own += c.user + c.system
        if children:  # and the children that exited and were waited for (a closed pool)
            own += c.children_user + c.children_system
    return busy, own


class ForeignLoad:
    """Cores' worth of CPU time other processes used over a `with` block (this process, and
    with `children` its worker processes, left out): on a 2-core machine one busy neighbour
    makes a parallel kernel wait at every barrier for a descheduled thread, and its time can
    read 100x."""

    cores: float = 0.0

    def __init__(self, children: bool = True):
        self.children = children

    def __enter__(self):
        self._busy, self._own = _busy_seconds(children=self.children)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        busy, own = _busy_seconds(children=self.children)
        wall = max(time.perf_counter() - self._t0, 1e-9)
        self.cores = max(0.0, (busy - self._busy) - (own - self._own)) / wall
        return False

    @property
    def busy(self) -> bool:
        return self.cores >= FOREIGN_LOAD_LIMIT


def _sample(f, inputs, batches: int = 5) -> tuple[float, float, float]:
    """(best ms, median ms, foreign load) of `batches` batched samples of ~6 ms each."""
    f(*inputs)  # first call: oneDNN reorders its weights then; not a steady-state cost
    t0 = time.perf_counter()
    f(*inputs)
    one = max(time.perf_counter() - t0, 1e-6)
    number = max(1, min(200, int(0.006 / one)))
    samples = []
    with ForeignLoad(children=False) as load:
        for _ in range(batches):
            t0 = time.perf_counter()
            for _ in range(number):
                f(*inputs)
            samples.append((time.perf_counter() - t0) / number)
    return float(np.min(samples) * 1e3), float(np.median(samples) * 1e3), load.cores


def measure_call(vm, name: str, inputs, roof: Roof | None = None) -> Measurement:
    """Time `vm[name](*inputs)`, re-timing up to RETRIES times while the machine is loaded,
    the samples spread or the time is outside `roof`; the best of the attempts is returned
    (trusted or not)."""
    f = vm[name]
    best = None
    for attempt in range(1, RETRIES + 2):
        ms, med, foreign = _sample(f, inputs)
        m = Measurement(ms, med, foreign, attempt, roof)
        if best is None or (m.trusted, -m.ms) > (best.trusted, -best.ms):
            best = m
        if m.trusted:
            break
    return Measurement(best.ms, best.median_ms, best.foreign_load, attempt, roof)


@dataclass(frozen=True)
class Paired:
    """Two builds of one kernel timed side by side (`measure_paired`).

    Attributes:
        a_ms, b_ms: each side's median over the rounds of its best sample in the round.
        ratio: the median over the rounds of a's time over b's in the same round.
        foreign_load: the median over all samples of the load other processes put on the host.
    """

    a_ms: float
    b_ms: float
    ratio: float
    foreign_load: float
    rounds: int

    @property
    def trusted(self) -> bool:
        return self.foreign_load < FOREIGN_LOAD_LIMIT


def measure_paired(f_a, f_b, inputs, rounds: int = PAIR_ROUNDS) -> Paired:
    """Time `f_a(*inputs)` against `f_b(*inputs)` in `rounds` rounds of a short sample of each,
    in the other order each round, and compare them within each round.

    A microsecond kernel on a shared VM runs at one speed for a spell and at up to twice that
    for the next (both builds alike), and a spell outlasts a whole `measure_call`: timing one
    build and then the other compares two spells, not two schedules. Within a round both
    samples fall in the same spell as a rule, so the median of the rounds' ratios is the
    builds' ratio and a round that straddles two spells is outvoted."""
    a, b, ratios, loads = [], [], [], []
    for r in range(rounds):
        got = {}
        for side, f in (((0, f_a), (1, f_b)) if r % 2 == 0 else ((1, f_b), (0, f_a))):
            ms, _, foreign = _sample(f, inputs, batches=PAIR_BATCHES)
            got[side] = ms
            loads.append(foreign)
        a.append(got[0])
        b.append(got[1])
        ratios.append(got[0] / got[1])
    return Paired(float(np.median(a)), float(np.median(b)), float(np.median(ratios)),
                  float(np.median(loads)), rounds)


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
