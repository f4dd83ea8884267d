"""Per-kernel choice between oneDNN and the default schedules, by a short timing on this host.

Every conv2d / matmul chain oneDNN can take is timed both ways, each in isolation with its real
weights: all candidates go into one module per side (two builds in all; three with a tuning
database, whose records ship only where they beat the default schedules, so the codegen side is
the faster of the two; one more per lower compute precision the library may use, bf16), and
each is timed as an exported artifact runs it. The fastest side wins; a library call must beat
the codegen kernel by `MARGIN` to be chosen, since it also costs a dispatch and a dependency.
Timings are cached per (workload, target, TVM and extension version, codegen code, CPU model,
threads), so a second compile of the same shapes does not re-time; a timing taken while the
machine was busy is not cached (timing).

The module sits below the pipeline: the trial build (module -> VM executable on the default
schedules) is passed in, and `dispatch` is the pipeline's dispatch step: it returns the module,
the choices and the notes, and writes nothing else.
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import asdict, dataclass

import numpy as np

from .. import fallbacks
from ..errors import error_line
from ..timing import (TimingCache, cache_key, distinct_dim_names, measure_call, random_inputs,
                     roof, timing_dims)

MARGIN = 0.95  # library chosen when library_ms < MARGIN * codegen_ms
# A lower compute precision (bf16) of a library call is chosen only when it takes under this
# share of the fp32 call's time: it costs accuracy, so a speed-up within timing noise does not
# pay for it, and such near-ties flipped from one compile to the next.
LOWER_PRECISION_GAIN = 0.9


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
    precision: str = "fp32"  # the library call's compute precision ("fp32", "bf16", "int8")
    library_bf16_ms: float | None = None  # None: bf16 was not a candidate
    trusted: bool = True  # False: measured on a busy or noisy machine, not cached
    note: str = ""
    # A QDQ model's quantized convolution / matmul, whose library call is int8 (a library
    # choice's precision is then "int8"; codegen runs the QDQ graph as imported).
    quantized: bool = False
    # A dynamically quantized model's integer matmul (MatMulInteger), quantized in the call.
    dynamic: bool = False
    # GFLOP of one call as TVM counts the workload's ops (padding taps included); None where
    # a dim is symbolic. Against the time, how near the call runs to what the host can do.
    gflop: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


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
    from ..passes.values import const_array

    binds = {p: a for p, a in zip(func.params, args) if const_array(a) is not None}
    plain = func
    for attr in ("Composite", "Primitive"):
        if plain.attrs is not None and attr in plain.attrs:
            plain = plain.without_attr(attr)
    if not binds:
        return plain
    import tvm
    from tvm import relax

    # An int8 group's weight is the dequantize of its int8 constant: folded, as the build
    # folds it, so the codegen side is timed on the fp32 weights it would run with.
    return relax.transform.FoldConstant()(tvm.IRModule({"f": plain.bind_params(binds)}))["f"]


def _shape_params_first(func):
    """`func` with its shape params (the symbolic dims a fused function is passed) first: a
    function checks its params in order, and a tensor param shaped by an expression of those
    dims (batch * seq) can only be checked once they are defined."""
    from tvm import relax

    shapes = [p for p in func.params if isinstance(p.ty, relax.ShapeType)]
    if not shapes:
        return func
    rest = [p for p in func.params if not isinstance(p.ty, relax.ShapeType)]
    return relax.Function([*shapes, *rest], func.body, func.ret_ty, func.is_pure, func.attrs)


def _loaded_like_an_artifact(executable, folder: str, name: str):
    """A side as an artifact with oneDNN kernels runs it: exported, then loaded as
    `runtime.load` does, its TVM kernels on oneDNN's OpenMP team. Both sides are timed so:
    with either one on TVM's pool, the two pools take turns on the cores and small kernels
    measure the hand-over between pools rather than their own work."""
    from ..library import onednn

    path = os.path.join(folder, name)
    executable.export_library(path)
    return onednn.load_library(path)


def _with_bf16_params(mod, name, gv, params, call_args, convert: bool):
    """`mod` plus the timing wrapper `name` of composite `gv` whose float32 tensor params are
    bf16 (converted back to fp32 in the wrapper, a round trip the bf16 lowering removes), and
    the positions of those params."""
    from tvm import relax

    idx = [i for i, p in enumerate(params) if convert and not isinstance(p.ty, relax.ShapeType)
           and str(p.ty.dtype) == "float32"]
    new = [relax.Var(p.name, relax.TensorType(p.ty.shape, "bfloat16")) if i in idx else p
           for i, p in enumerate(params)]
    remap = dict(zip(params, new))
    bb = relax.BlockBuilder(mod)
    with bb.function(name, new, {"global_symbol": name}):
        args = [bb.emit(relax.op.astype(remap[a], "float32"))
                if isinstance(a, relax.Var) and a in remap and remap[a] is not a else a
                for a in call_args]
        bb.emit_func_output(bb.emit(relax.Call(gv, args)))
    return bb.get(), idx


# Rounds over every side of one kernel while any side's timing is untrusted: a burst of load
# that hit one side's samples is unlikely to hit it again in the next round, and load only
# ever adds time, so each side keeps its fastest round.
SIDE_ROUNDS = 2


def _time_sides(sides: dict, name: str) -> dict:
    """{side: Measurement} of `vm[name](*inputs)` for each side (vm, inputs, Roof or None):
    every side in turn, in the other order each round, until all are trusted or SIDE_ROUNDS
    ran."""
    best = {}
    order = list(sides)
    for r in range(SIDE_ROUNDS):
        for side in (order if r % 2 == 0 else order[::-1]):
            vm, inputs, bounds = sides[side]
            m = measure_call(vm, name, inputs, bounds)
            old = best.get(side)
            if old is None or (m.trusted, -m.ms) > (old.trusted, -old.ms):
                best[side] = m
        if all(m.trusted for m in best.values()):
            break
    return best


@functools.lru_cache(maxsize=1)
def _host_figures() -> tuple[dict, float | None]:
    """({dtype: peak GFLOP/s per core}, memory GB/s) of this host, for the timings' roofs."""
    from ..errors import TargetError
    from ..targets.registry import detect_host

    try:
        host = detect_host()
    except TargetError:  # unreadable target data: no figures only means no roofline check
        return {}, None
    return {d: p.value for d, p in host.peak_gflops.items()}, host.bandwidth_gbs()


def _kernel_size(func) -> tuple[float, float] | None:
    """(FLOPs, bytes of its tensors) of a statically shaped kernel function, or None."""
    import tvm
    from tvm import relax
    from tvm.s_tir.analysis import estimate_tir_flops

    tys = [p.ty for p in func.params] + [func.ret_ty]
    if not all(isinstance(t, relax.TensorType) and t.shape is not None
               and all(isinstance(d, tvm.tirx.IntImm) for d in t.shape.values) for t in tys):
        return None
    try:
        legal = relax.transform.LegalizeOps()(tvm.IRModule({"main": func}))
        flops = sum(float(estimate_tir_flops(tvm.IRModule({"f": f})))
                    for f in legal.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    except RuntimeError:  # TVM's estimator refusing a loop nest it cannot count: no roof
        return None
    nbytes = sum(float(np.prod([int(d) for d in t.shape.values]))
                 * tvm.DataType(str(t.dtype)).bits // 8 for t in tys)
    return flops, nbytes


def _gflop(composite) -> float | None:
    """GFLOP of one call of a oneDNN group (its composite function as TVM legalizes it)."""
    size = _kernel_size(_kernel_function(composite, []))
    return None if size is None else size[0] / 1e9


def _roofs(func, quantized: bool, sides) -> dict:
    """{side: Roof or None} of one kernel: each side at the peak of the precision it computes
    in (a quantized group's library call is int8)."""
    size = _kernel_size(func)
    peaks, bandwidth = _host_figures()
    out = {}
    for side in sides:
        library = isinstance(side, str)
        dtype = ("int8" if quantized else "bf16" if side == "library_bf16_ms" else "fp32") \
            if library else "fp32"
        out[side] = roof(*size, peaks.get(dtype), bandwidth, library) if size else None
    return out


def _as_bf16(arrays, idx, dev):
    import ml_dtypes
    import tvm

    return [tvm.runtime.tensor(a.astype(ml_dtypes.bfloat16) if i in idx else a, dev)
            if isinstance(a, np.ndarray) else a for i, a in enumerate(arrays)]


def choose(mod, target, build_codegen, build_library, ext_id: str, force: str | None = None,
           cache: TimingCache | None = None, compute: tuple[str, ...] = ("fp32",),
           fp32_only=frozenset(), bounds: dict | None = None, pinned: dict | None = None):
    """Decide, per oneDNN group of `mod` (from onednn.partition), library or codegen, and the
    library call's compute precision.

    Args:
        build_codegen: builders IRModule -> VM executable by name ("default": the default
            schedules; "tuned": with the database's records), one for each way the kernel may
            ship as codegen: the fastest is the codegen side.
        build_library: (IRModule, compute precision) -> VM executable whose composites are
            lowered to packed calls computing in that precision.
        ext_id: the extension's identity (its build hash), part of the cache key.
        force: "library" or "codegen" to skip timing; a forced library call computes in
            `compute[0]`.
        compute: the library's compute precisions that may be chosen ("fp32", "bf16"); each is
            timed and the fastest kept.
        fp32_only: workload keys that must stay fp32 (the accuracy gate took bf16 back).
        bounds: symbolic dim name -> (lo, hi): a kernel with symbolic dims is timed at the
            values `timing.timing_dims` picks from them (one choice for every value).
        pinned: workload key -> compute precision of the library calls a tuning database was
            tuned with (`compile --require-db`): those run on the library, every other
            workload as codegen, nothing timed, so the module has the database's tasks.

    Returns:
        (GlobalVars to keep as library calls, GlobalVar -> compute precision of each kept one,
        list of Choice).
    """
    import tvm
    from tvm import relax

    from ..library import onednn

    # Timed with a value per dim name, so distinct dims need distinct names.
    groups = {gv: distinct_dim_names(f) for gv, f in onednn.composites(mod).items()}
    if not groups:
        return set(), {}, []
    sites = _call_sites(mod, groups)
    by_key: dict[str, list] = {}
    for gv, func in groups.items():
        by_key.setdefault(onednn.workload_key(func), []).append(gv)

    def allowed(k):
        return [c for c in compute if c == "fp32" or k not in fp32_only] or ["fp32"]

    gflop = {k: _gflop(groups[g[0]]) for k, g in by_key.items()}

    if force in ("library", "codegen") or pinned is not None:
        choices, keep, prec = [], set(), {}
        for k, g in by_key.items():
            quant = onednn.is_quantized(groups[g[0]])
            if pinned is not None:
                side = "library" if k in pinned else "codegen"
                c = pinned[k] if pinned.get(k) in allowed(k) else allowed(k)[0]
                why = "as the database was tuned"
            else:
                side, c, why = force, allowed(k)[0], f"--dispatch {force}"
            c = "int8" if quant else c
            choices.append(Choice(k, sum(len(sites.get(gv, ())) for gv in g), side, None, None,
                                  reason=why, precision=c if side == "library" else "fp32",
                                  quantized=quant, dynamic=onednn.is_dynamic(groups[g[0]]),
                                  gflop=gflop[k]))
            if side == "library":
                keep |= set(g)
                prec.update(dict.fromkeys(g, c))
        return keep, prec, choices

    cache = cache or TimingCache()
    target_text = str(target)
    dims = {k: timing_dims(groups[g[0]], bounds or {}, image=onednn.is_conv(groups[g[0]]))
            for k, g in by_key.items()}

    def key_of(k):
        at = ",".join(f"{n}={v}" for n, v in dims[k].items())
        return cache_key(k + (f"@{at}" if at else ""), target_text, ext_id)

    lib_fields = {"fp32": "library_ms", "bf16": "library_bf16_ms"}
    # fp32 is always timed: it is what a kernel the accuracy gate takes back from bf16 runs.
    timed_compute = tuple(dict.fromkeys(("fp32", *compute)))
    fields = ("codegen_ms", "codegen_by", *(lib_fields[c] for c in timed_compute))
    timed, todo = {}, []
    for k in by_key:
        hit = cache.get(key_of(k), fields)
        if hit is not None:
            timed[k] = {**dict(zip(fields, hit)), "cached": True, "trusted": True, "note": ""}
        else:
            todo.append(k)
    if todo:
        lib_mod, cg_mod = tvm.IRModule(), tvm.IRModule()
        feeds, bf16_args = {}, {}
        # The bf16 calls are timed on bf16 activations: in the graph their producer writes bf16
        # (a conversion fused into it, or a bf16 library call before), so converting fp32
        # inside the timed call would charge bf16 for work the built model does not do.
        bf16_mod = tvm.IRModule() if "bf16" in timed_compute else None
        rng = np.random.default_rng(0)
        for i, k in enumerate(todo):
            gv = by_key[k][0]
            func = _shape_params_first(_kernel_function(groups[gv], sites[gv][0]))
            name = f"tvmopt_kernel_{i}"
            cg_mod[name] = func.with_attr("global_symbol", name)
            params = [relax.Var(p.name, p.ty) for p in func.params]
            lib_mod[gv] = groups[gv]
            bound = dict(zip(groups[gv].params, sites[gv][0]))
            # The wrapper's params in func's order: shape params first, then the tensors.
            shape_it = iter([p for p in params if isinstance(p.ty, relax.ShapeType)])
            tensor_it = iter([p for p in params if not isinstance(p.ty, relax.ShapeType)])
            call_args = []
            for p in groups[gv].params:
                a = bound[p]
                if isinstance(p.ty, relax.ShapeType):  # the dims, in the wrapper's own vars
                    call_args.append(next(shape_it))
                else:
                    call_args.append(a if not isinstance(a, relax.Var) else next(tensor_it))
            # Built through a BlockBuilder so the call's type is inferred in the wrapper's own
            # symbolic dims (the composite's are its private copies).
            bb = relax.BlockBuilder(lib_mod)
            with bb.function(name, params, {"global_symbol": name}):
                bb.emit_func_output(bb.emit(relax.Call(gv, call_args)))
            lib_mod = bb.get()
            feeds[name] = random_inputs(func, rng, dims[k])
            if bf16_mod is not None:
                bf16_mod[gv] = groups[gv]
                bf16_mod, bf16_args[name] = _with_bf16_params(
                    bf16_mod, name, gv, params, call_args,
                    convert=not onednn.is_quantized(groups[gv]))
        dev = tvm.cpu()
        with tempfile.TemporaryDirectory(prefix="tvmopt-dispatch-") as tmp:
            vm_cg = {by: relax.VirtualMachine(
                _loaded_like_an_artifact(b(cg_mod), tmp, f"codegen-{by}.so"), dev)
                for by, b in build_codegen.items()}
            vm_lib = {c: relax.VirtualMachine(
                _loaded_like_an_artifact(build_library(bf16_mod if c == "bf16" else lib_mod, c),
                                         tmp, f"library-{c}.so"), dev)
                for c in timed_compute}
            for i, k in enumerate(todo):
                name = f"tvmopt_kernel_{i}"
                inputs = [tvm.runtime.tensor(a, dev) if isinstance(a, np.ndarray) else a
                          for a in feeds[name]]
                sides = {lib_fields[c]: (vm, _as_bf16(feeds[name], bf16_args[name], dev)
                                         if c == "bf16" else inputs)
                         for c, vm in vm_lib.items()}
                sides.update({("codegen", by): (vm, inputs) for by, vm in vm_cg.items()})
                roofs = _roofs(cg_mod[name], onednn.is_quantized(groups[by_key[k][0]]), sides)
                best = _time_sides({s: (*v, roofs[s]) for s, v in sides.items()}, name)
                ms = {f: m for f, m in best.items() if isinstance(f, str)}
                cg = min(((m, f[1]) for f, m in best.items() if not isinstance(f, str)),
                         key=lambda mb: mb[0].ms)
                every = [*ms.values(), cg[0]]
                bad = [m for m in every if not m.trusted]
                entry = {f: m.ms for f, m in ms.items()}
                entry.update(codegen_ms=cg[0].ms, codegen_by=cg[1])
                timed[k] = {**entry, "cached": False, "trusted": not bad,
                            "note": f"not cached: {bad[0].why_untrusted()}" if bad else ""}
                if not bad:
                    cache.put(key_of(k), k, **entry)
        cache.save()
    keep, prec, choices = set(), {}, []
    for k, gvs in by_key.items():
        t = timed[k]
        quant = onednn.is_quantized(groups[gvs[0]])
        # An int8 call computes in int8 whatever compute precision its build was given.
        lib = ({"int8": t["library_ms"]} if quant
               else {c: t[lib_fields[c]] for c in allowed(k)})
        best = min(lib, key=lib.get)
        # (a quantized group's only candidate is int8, so it has no fp32 to tie with)
        near_tie = (best != "fp32" and "fp32" in lib
                    and lib[best] >= LOWER_PRECISION_GAIN * lib["fp32"])
        if near_tie:
            best = "fp32"
        use_lib = lib[best] < MARGIN * t["codegen_ms"]
        # A timing taken under load cannot send a kernel the library takes to codegen: the
        # library call is the same code wherever it lands, while the codegen kernel is timed
        # alone and is fused with its neighbours in the model, where a schedule that fit the
        # lone kernel may not (an int8 residual group then ran as a naive loop nest).
        held = not use_lib and not t["trusted"]
        use_lib = use_lib or held
        if use_lib:
            keep |= set(gvs)
            prec.update(dict.fromkeys(gvs, best))
        n_sites = sum(len(sites.get(gv, ())) for gv in gvs)
        bf16 = t.get("library_bf16_ms")
        choices.append(Choice(
            k, n_sites, "library" if use_lib else "codegen", round(t["library_ms"], 4),
            round(t["codegen_ms"], 4), t["cached"],
            ("library kept: its timing was not trusted" if held else "faster by timing")
            if use_lib else "codegen as fast or faster", t["codegen_by"],
            precision=best if use_lib else "fp32",
            library_bf16_ms=round(bf16, 4) if bf16 is not None else None,
            trusted=t["trusted"], note="; ".join(filter(None, [
                t["note"], "bf16 taken back by the accuracy gate" if k in fp32_only else "",
                f"fp32 kept: bf16 not {1 / LOWER_PRECISION_GAIN:.2g}x faster" if near_tie
                and use_lib else "",
                "timed at " + ", ".join(f"{n}={v}" for n, v in dims[k].items())
                if dims[k] else ""])),
            quantized=quant, dynamic=onednn.is_dynamic(groups[gvs[0]]), gflop=gflop[k]))
    return keep, prec, choices


# ------------------------------------------------------------------------ the pipeline's step
def dispatches(target, mode: str) -> bool:
    """Whether the dispatch step runs at all: `mode` (PipelineConfig.dispatch) is not
    "codegen" and the target is x86, the library's architecture."""
    return mode != "codegen" and is_x86(target)


def dispatch(mod, target, cfg, trial_build) -> tuple[object, list, list[str]]:
    """The pipeline's dispatch step: put whole recurrent nodes, then conv2d / matmul / attention
    chains, on oneDNN where they time faster (`cfg.dispatch` auto) or wherever oneDNN takes
    them (library), each in the precision chosen by timing; the rest stays codegen.

    Args:
        cfg: the pipeline's PipelineConfig, read only (dispatch, library_compute, fp32_only,
            retime, database, pinned_library, dim_upper_bounds).
        trial_build: (IRModule, **PipelineConfig overrides) -> VM executable on the default
            schedules: how each side of a timing is built.

    Returns:
        (module, the Choice of every workload, notes for the user).
    """
    import platform

    from ..library import onednn
    from ..passes.recurrent import loop_and_inline, recurrent_functions
    from ..targets.registry import host_cpu_features

    notes: list[str] = []
    if platform.machine().lower() not in ("x86_64", "amd64"):
        # The extension is built for, and the kernels timed on, the build host.
        notes.append(f"oneDNN dispatch needs an x86 build host (this is {platform.machine()}): "
                     "default schedules used for every kernel")
        fallbacks.record("library_unavailable", "oneDNN",
                         f"the build host is {platform.machine()}, not x86")
        return onednn.strip_qdq_weights(loop_and_inline(mod)), [], notes
    try:
        onednn.load_extension()
    except Exception as err:  # noqa: BLE001 - a missing library falls back, recorded
        reason = error_line(err)
        notes.append(f"oneDNN unavailable ({reason}): default schedules used for every kernel")
        fallbacks.record("library_unavailable", "oneDNN", reason)
        return onednn.strip_qdq_weights(loop_and_inline(mod)), [], notes
    force = "library" if cfg.dispatch == "library" else None

    # Whole LSTM / GRU / RNN nodes first, so that bodies left to codegen are inlined before the
    # partition and their input projections are offered to the library like any other matmul.
    choices: list = []
    if recurrent_functions(mod):
        keep, choices = choose_recurrent(
            mod, target, build_codegen=lambda m: trial_build(m), ext_id=onednn.extension_id(),
            force=force, cache=TimingCache(read=not cfg.retime), pinned=cfg.pinned_library)
        mod = loop_and_inline(onednn.lower_recurrent(mod, keep))

    # int8 kernels are timed and run on this host: its CPU decides whether they are offered.
    no_int8 = onednn.int8_unavailable(host_cpu_features())
    if no_int8 and mod.get_attr(onednn.QDQ_WEIGHTS_ATTR):
        notes.append(f"QDQ model: this host has {no_int8}")
    elif no_int8 and (onednn.has_integer_matmul(mod) or onednn.has_integer_conv(mod)):
        notes.append(f"dynamically quantized model: this host has {no_int8}")
    part = onednn.partition(mod, int8=no_int8 is None)
    compute = tuple(cfg.library_compute)
    if "bf16" in compute and not host_has_bf16():
        # Lower-precision kernels are chosen by timing them here: a build host without bf16
        # units cannot time them for a target that has some.
        compute = tuple(c for c in compute if c != "bf16")
        notes.append("bf16 library kernels are chosen by timing on the build host, which has "
                     "no bf16 units (amx_bf16, avx512_bf16): fp32 kept")
    # With a database, a tuned kernel ships only where it beats the default schedule
    # (tuning.prefer), so the codegen side is timed both ways and the faster counts.
    codegen = {"default": lambda m: trial_build(m)}
    if cfg.database is not None:
        codegen["tuned"] = lambda m: trial_build(m, database=cfg.database,
                                                 weight_prepack=cfg.weight_prepack)
    keep, precision_of, chosen = choose(
        part, target, build_codegen=codegen,
        build_library=lambda m, c: trial_build(onednn.lower(m, compute=c)),
        ext_id=":".join(filter(None, [onednn.extension_id(), cfg.database_id])), force=force,
        cache=TimingCache(read=not cfg.retime), compute=compute, fp32_only=cfg.fp32_only,
        bounds=_dim_bounds(mod, cfg.dim_upper_bounds), pinned=cfg.pinned_library)
    choices = [*choices, *chosen]
    untrusted = [c for c in choices if not c.trusted]
    if untrusted:
        notes.append(f"{len(untrusted)} kernel timing(s) taken on a busy or noisy machine were "
                     f"not cached ({untrusted[0].note.removeprefix('not cached: ')}); the next "
                     "compile times them again")
    # The int8 weights noted in the simplify phase stay out of the build, whatever happens.
    return onednn.strip_qdq_weights(onednn.lower(part, keep, compute=precision_of)), choices, notes


def _dim_bounds(mod, upper: dict) -> dict[str, tuple[int, int]]:
    """Symbolic dim name -> (lo, hi): the program's own bounds (a `.pt2`'s range constraints),
    then the user's `--dim` upper bounds over them."""
    from tvm import relax

    bounds = {}
    for f in mod.functions.values():
        if isinstance(f, relax.Function) and f.attrs is not None:
            lower = dict(f.attrs.get("tir_var_lower_bound") or {})
            for k, v in dict(f.attrs.get("tir_var_upper_bound") or {}).items():
                bounds[str(k)] = (int(lower.get(k, 1)), int(v))
    for k, hi in (upper or {}).items():
        bounds[k] = (bounds.get(k, (1, hi))[0], int(hi))
    return bounds


def is_x86(target) -> bool:
    triple = str(target.attrs.get("mtriple", "") or "")
    return target.kind.name == "llvm" and (not triple or triple.startswith(("x86_64", "i686")))


def host_has_bf16() -> bool:
    """This build host has bf16 matrix or dot-product units (where bf16 kernels are timed)."""
    from ..targets.registry import host_cpu_features

    return bool({"amx_bf16", "avx512_bf16"} & host_cpu_features())


# ------------------------------------------------------------------------ recurrent layers
def _recurrent_kernel(mod, gv, spec, args, library: bool):
    """One recurrent node as a module of its own: `main` takes the node's run-time inputs
    (weights bound in), and runs either the library call or the loop kernels. The loop
    kernels' input projection is a big matmul that the conv2d/matmul dispatch after this one
    offers to oneDNN like any other: it is on oneDNN here too, so the side is timed as it will
    mostly run."""
    import tvm
    from tvm import relax

    from ..passes.recurrent import loop_and_inline
    from ..passes.values import const_array
    from ..library.onednn import lower, lower_recurrent, partition

    params = [relax.Var(f"in{i}", a.ty) for i, a in enumerate(args) if const_array(a) is None]
    it = iter(params)
    call_args = [a if const_array(a) is not None else next(it) for a in args]
    kernel = tvm.IRModule({gv: mod[gv]})
    body = relax.Function(params, relax.Call(gv, call_args), mod[gv].ret_ty)
    kernel["main"] = body.with_attr("global_symbol", "main")
    if library:
        return lower_recurrent(kernel)
    return lower(partition(loop_and_inline(kernel), conv=False))


def _static_steps(spec, args) -> bool:
    """The node's sequence length is a number (not a run-time dim)."""
    from tvm import tirx

    x = args[spec["inputs"].index("X")]
    return isinstance(x.ty.shape.values[1 if spec["attrs"].get("layout") else 0], tirx.IntImm)


def _recurrent_inputs(spec, kernel, rng):
    """Feeds for a recurrent kernel: floats normal, sequence_lens all full length (zeros, as
    random_inputs gives integers, would time sequences of no steps)."""
    arrays = random_inputs(kernel["main"], rng)
    steps = int(kernel["main"].params[0].ty.shape.values[1 if spec["attrs"].get("layout") else 0])
    return [np.full_like(a, steps) if a.dtype.kind == "i" else a for a in arrays]


def choose_recurrent(mod, target, build_codegen, ext_id: str, force: str | None = None,
                     cache: TimingCache | None = None, pinned: dict | None = None):
    """Decide, per recurrent node oneDNN can run, library or codegen (the loop kernels) by
    timing both on this host, as `choose` does for conv2d/matmul chains.

    Returns:
        (GlobalVars of the bodies to run on the library, list of Choice).
    """
    import tvm
    from tvm import relax

    from ..library import onednn

    ok, _ = onednn.recurrent_sites(mod)
    keep, choices = set(), []
    if not ok:
        return keep, choices
    if force in ("library", "codegen") or pinned is not None:
        for gv, (spec, args) in ok.items():
            key = onednn.recurrent_workload_key(spec, args)
            side = force if pinned is None else "library" if key in pinned else "codegen"
            choices.append(Choice(key, 1, side, None, None,
                                  reason=f"--dispatch {force}" if pinned is None
                                  else "as the database was tuned"))
            if side == "library":
                keep.add(gv)
        return keep, choices
    cache = cache or TimingCache()
    target_text = str(target)
    rng = np.random.default_rng(0)
    dev = tvm.cpu()
    with tempfile.TemporaryDirectory(prefix="tvmopt-dispatch-rnn-") as tmp:
        for i, (gv, (spec, args)) in enumerate(ok.items()):
            key = onednn.recurrent_workload_key(spec, args)
            if not _static_steps(spec, args):
                # There is no one length to time both sides at: the library's primitive takes
                # the time dim at execution, and its cost per step falls with length where
                # the loop kernel's does not.
                keep.add(gv)
                choices.append(Choice(key, 1, "library", None, None,
                                      reason="run-time sequence length"))
                continue
            # The codegen side's form is part of what was timed.
            ckey = cache_key(key + "|loop-kernel", target_text, ext_id)
            hit = cache.get(ckey)
            note, trusted, cached = "", True, hit is not None
            if hit is not None:
                lib_ms, cg_ms = hit
            else:
                sides = {}
                for side, library in (("library", True), ("codegen", False)):
                    kernel = _recurrent_kernel(mod, gv, spec, args, library)
                    exe = _loaded_like_an_artifact(build_codegen(kernel), tmp, f"{side}{i}.so")
                    vm = relax.VirtualMachine(exe, dev)
                    inputs = [tvm.runtime.tensor(a, dev)
                              for a in _recurrent_inputs(spec, kernel, rng)]
                    sides[side] = (vm, inputs, None)
                sides = _time_sides(sides, "main")
                lib_ms, cg_ms = sides["library"].ms, sides["codegen"].ms
                bad = [m for m in sides.values() if not m.trusted]
                trusted = not bad
                if bad:
                    note = f"not cached: {bad[0].why_untrusted()}"
                else:
                    cache.put(ckey, key, library_ms=lib_ms, codegen_ms=cg_ms)
            use_lib = lib_ms < MARGIN * cg_ms
            # As for convolutions and matmuls: a timing taken under load cannot send a node
            # the library takes to codegen.
            held = not use_lib and not trusted
            use_lib = use_lib or held
            if use_lib:
                keep.add(gv)
            choices.append(Choice(key, 1, "library" if use_lib else "codegen",
                                  round(lib_ms, 4), round(cg_ms, 4), cached,
                                  ("library kept: its timing was not trusted" if held
                                   else "faster by timing") if use_lib
                                  else "codegen as fast or faster",
                                  trusted=trusted, note=note))
    cache.save()
    return keep, choices
