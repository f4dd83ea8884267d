"""Per-kernel choice between oneDNN and the default schedules, by a short timing on this host.

Every conv2d / matmul chain oneDNN can take is timed both ways, each in isolation with its real
weights: all candidates go into one module per side (two builds in all; three with a tuning
database, whose records ship only where they beat the default schedules, so the codegen side is
the faster of the two), and each is timed as an exported artifact runs it. The faster side
wins; a library call must beat the codegen kernel by `MARGIN` to be chosen, since it also costs
a dispatch and a dependency. Timings are cached per (workload, target, TVM and extension
version, codegen code, CPU model, threads), so a second compile of the same shapes does not
re-time.

The module is pure: `build` (module -> VM executable, the pipeline's codegen path) is passed in,
so this sits below the pipeline that calls it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..files import cache_root

MARGIN = 0.95  # library chosen when library_ms < MARGIN * codegen_ms
_CACHE_NAME = "dispatch-timings.json"
# Changes when the way kernels are timed changes, so older cached timings are not reused.
TIMING_METHOD = "both-sides-on-the-openmp-team"


@dataclass
class Choice:
    """One workload's decision (every call site with these shapes gets it)."""

    kernel: str  # pattern and shapes (workload_key)
    sites: int  # call sites in the model
    choice: str  # "library" or "codegen"
    library_ms: float | None
    codegen_ms: float | None
    cached: bool = False
    reason: str = ""
    codegen_by: str = "default"  # which codegen build codegen_ms is ("default" or "tuned")

    def to_json(self) -> dict:
        return asdict(self)


def _host_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                        "")
    except OSError:
        return ""


def _threads() -> str:
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


def _cache_key(kernel: str, target_text: str, ext_id: str) -> str:
    import tvm

    text = "\n".join([kernel, target_text, tvm.__version__, ext_id, codegen_id(), _host_id(),
                      _threads(), TIMING_METHOD])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class TimingCache:
    """A JSON file of measured kernel pairs; unreadable or foreign entries are ignored."""

    def __init__(self, path: Path | None = None):
        self.path = path or cache_root() / _CACHE_NAME
        try:
            self.data = json.loads(self.path.read_text())
            if not isinstance(self.data, dict):
                self.data = {}
        except (OSError, ValueError):
            self.data = {}

    def get(self, key: str, fields=("library_ms", "codegen_ms")):
        v = self.data.get(key)
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


def _call_sites(mod, groups) -> dict:
    """Composite GlobalVar -> the args of each call site (FuseOpsByPattern shares one function
    between identical chains, since the weights are arguments)."""
    from tvm import relax

    sites = {}

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, relax.GlobalVar) and e.op in groups:
            sites.setdefault(e.op, []).append(list(e.args))

    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and gv not in groups:
            relax.analysis.post_order_visit(func, visit)
    return sites


def _kernel_function(func, args):
    """The composite as a plain function of its non-constant inputs, weights bound in."""
    from .layout import _const_array

    binds = {p: a for p, a in zip(func.params, args) if _const_array(a) is not None}
    plain = func
    for attr in ("Composite", "Primitive"):
        if plain.attrs is not None and attr in plain.attrs:
            plain = plain.without_attr(attr)
    return plain.bind_params(binds) if binds else plain


def random_inputs(func, rng) -> list[np.ndarray]:
    """Arrays for a Relax function's static tensor params: floats normal, integers 0 (an index
    in range for every gather)."""
    out = []
    for p in func.params:
        shape, dtype = [int(d) for d in p.ty.shape.values], str(p.ty.dtype)
        out.append(rng.standard_normal(shape).astype(dtype) if dtype.startswith("float")
                   else np.zeros(shape, dtype=dtype))
    return out


def time_call(vm, name: str, inputs, dev) -> float:
    """Best-of-5 ms of `name`, each sample a batch of calls lasting ~6 ms."""
    f = vm[name]
    f(*inputs)  # first call: oneDNN reorders its weights then; not a steady-state cost
    t0 = time.perf_counter()
    f(*inputs)
    one = max(time.perf_counter() - t0, 1e-6)
    number = max(1, min(200, int(0.006 / one)))
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(number):
            f(*inputs)
        samples.append((time.perf_counter() - t0) / number)
    # The minimum: other processes and the other runtime's thread pool only ever add time.
    return float(np.min(samples) * 1e3)


def _loaded_like_an_artifact(executable, folder: str, name: str):
    """A side as an artifact with oneDNN kernels runs it: exported, then loaded as
    `runtime.load` does, its TVM kernels on oneDNN's OpenMP team. Both sides are timed so:
    with either one on TVM's pool, the two pools take turns on the cores and small kernels
    measure the hand-over between pools rather than their own work."""
    from . import onednn

    path = os.path.join(folder, name)
    executable.export_library(path)
    return onednn.load_library(path)


def choose(mod, target, build_codegen, build_library, ext_id: str, force: str | None = None,
           cache: TimingCache | None = None):
    """Decide, per oneDNN group of `mod` (from onednn.partition), library or codegen.

    Args:
        build_codegen: builders IRModule -> VM executable by name ("default": the default
            schedules; "tuned": with the database's records), one for each way the kernel may
            ship as codegen: the fastest is the codegen side.
        build_library: IRModule -> VM executable whose composites are lowered to packed calls.
        ext_id: the extension's identity (its build hash), part of the cache key.
        force: "library" or "codegen" to skip timing.

    Returns:
        (GlobalVars to keep as library calls, list of Choice).
    """
    import tvm
    from tvm import relax

    from . import onednn

    groups = onednn.composites(mod)
    if not groups:
        return set(), []
    sites = _call_sites(mod, groups)
    by_key: dict[str, list] = {}
    for gv, func in groups.items():
        by_key.setdefault(onednn.workload_key(func), []).append(gv)
    if force in ("library", "codegen"):
        choices = [Choice(k, sum(len(sites.get(gv, ())) for gv in g), force, None, None,
                          reason=f"--dispatch {force}") for k, g in by_key.items()]
        keep = set(groups) if force == "library" else set()
        return keep, choices

    cache = cache or TimingCache()
    target_text = str(target)
    fields = ("library_ms", "codegen_ms", "codegen_by")
    timed, todo = {}, []
    for k in by_key:
        hit = cache.get(_cache_key(k, target_text, ext_id), fields)
        if hit is not None:
            timed[k] = (*hit, True)
        else:
            todo.append(k)
    if todo:
        lib_mod, cg_mod = tvm.IRModule(), tvm.IRModule()
        feeds = {}
        rng = np.random.default_rng(0)
        for i, k in enumerate(todo):
            gv = by_key[k][0]
            func = _kernel_function(groups[gv], sites[gv][0])
            name = f"tvmopt_kernel_{i}"
            cg_mod[name] = func.with_attr("global_symbol", name)
            params = [relax.Var(p.name, p.ty) for p in func.params]
            lib_mod[gv] = groups[gv]
            bound = dict(zip(groups[gv].params, sites[gv][0]))
            call_args, it = [], iter(params)
            for p in groups[gv].params:
                a = bound[p]
                call_args.append(a if not isinstance(a, relax.Var) else next(it))
            lib_mod[name] = relax.Function(params, relax.Call(gv, call_args), func.ret_ty) \
                .with_attr("global_symbol", name)
            feeds[name] = random_inputs(func, rng)
        dev = tvm.cpu()
        with tempfile.TemporaryDirectory(prefix="tvmopt-dispatch-") as tmp:
            vm_cg = {by: relax.VirtualMachine(
                _loaded_like_an_artifact(b(cg_mod), tmp, f"codegen-{by}.so"), dev)
                for by, b in build_codegen.items()}
            vm_lib = relax.VirtualMachine(
                _loaded_like_an_artifact(build_library(lib_mod), tmp, "library.so"), dev)
            for i, k in enumerate(todo):
                name = f"tvmopt_kernel_{i}"
                inputs = [tvm.runtime.tensor(a, dev) for a in feeds[name]]
                lib_ms = time_call(vm_lib, name, inputs, dev)
                cg_ms, cg_by = min((time_call(vm, name, inputs, dev), by)
                                   for by, vm in vm_cg.items())
                timed[k] = (lib_ms, cg_ms, cg_by, False)
                cache.put(_cache_key(k, target_text, ext_id), k, library_ms=lib_ms,
                          codegen_ms=cg_ms, codegen_by=cg_by)
        cache.save()
    keep, choices = set(), []
    for k, gvs in by_key.items():
        lib_ms, cg_ms, cg_by, cached = timed[k]
        lib = lib_ms < MARGIN * cg_ms
        if lib:
            keep |= set(gvs)
        n_sites = sum(len(sites.get(gv, ())) for gv in gvs)
        choices.append(Choice(k, n_sites, "library" if lib else "codegen", round(lib_ms, 4),
                              round(cg_ms, 4), cached,
                              "faster by timing" if lib else "codegen as fast or faster", cg_by))
    return keep, choices
