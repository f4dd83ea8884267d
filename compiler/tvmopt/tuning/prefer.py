"""A tuned record is replayed only where it beats the default schedule on this host.

MetaSchedule keeps the best of the candidates it measured, not the best schedule there is: with
few trials per task (the usual budget on small machines) a record can be slower than the
default CPU rules. So at compile time each task the database serves is built both ways, each
in a module of its own kernels as compile builds them (weights bound as constants, so the
default rules' weight packing folds away as it does in the model), timed, and the record is
kept only where it measures faster than the default schedule by more than a tie. The two
builds of a task are timed side by side in alternating rounds and compared within each round
(timing.measure_paired): timed one after the other, a record of a microsecond kernel
was kept by one compile and dropped by the next on the same host. Timings are cached with the
dispatch timings (same host identity), keyed by the task, the record and the target.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass

import numpy as np

METHOD = "task-in-a-module-of-its-own, paired rounds"
# A record is kept when it takes less than this share of the default schedule's time in the
# paired rounds. Closer is a tie, which the default schedule wins: a kernel whose two builds
# differ by a percent or so (a transpose, a mean) would otherwise flip between compiles.
KEEP_BELOW = 0.97


@dataclass
class Comparison:
    task: str
    tuned_ms: float | None  # medians over the paired rounds
    default_ms: float | None
    kept: bool
    cached: bool = False
    ratio: float | None = None  # median over the rounds of tuned / default in the same round

    def to_json(self) -> dict:
        return asdict(self)


def _call_sites(fused_mod) -> dict:
    """PrimFunc name -> the args of its first call_tir in the model."""
    import tvm
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    sites = {}

    def visit(e):
        if isinstance(e, relax.Call) and e.op.same_as(call_tir):
            gv = e.args[0]
            sites.setdefault(gv.name_hint, (gv, e))

    for func in fused_mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return sites


def _wrapper(gv, call):
    """A Relax function calling the PrimFunc as the model does, constants kept, other args as
    parameters. None when an argument is neither (a shape, a tuple)."""
    import tvm
    from tvm import relax

    args = call.args[1]
    if not isinstance(args, relax.Tuple):
        return None
    params, new_args = [], []
    for a in args.fields:
        if isinstance(a, tvm.ir.expr.Constant):
            new_args.append(a)
        elif isinstance(a.ty, relax.TensorType) and isinstance(a.ty.shape, relax.ShapeExpr) \
                and all(isinstance(d, tvm.tirx.IntImm) for d in a.ty.shape.values):
            p = relax.Var(f"a{len(params)}", a.ty)
            params.append(p)
            new_args.append(p)
        else:
            return None
    if len(call.args) > 2:  # symbolic-shape tir_vars: not a static workload to time
        return None
    out_ty = call.ty_args[0]
    # A kernel with several outputs (a split) has a tuple type; call_tir takes their list.
    out_ty = list(out_ty.fields) if isinstance(out_ty, relax.TupleType) else out_ty
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        out = bb.emit(relax.call_tir(gv, relax.Tuple(new_args), out_ty))
        bb.emit_func_output(out)
    return bb.get()["main"]


def _key(task_mod, record, target) -> str:
    """The dispatch timings' key (TVM version, host, threads) over the task and its record."""
    import tvm_ffi

    from ..timing import cache_key

    what = f"record {tvm_ffi.structural_hash(task_mod)}\n{record.trace}"
    return "record:" + cache_key(what, str(target), METHOD)


def prefer_default_where_faster(replay, hw, fused_mod, weight_prepack: bool = False,
                                cache=None) -> list[Comparison]:
    """Time each served task tuned and with the default schedule; drop the records that do not
    win from `replay.db` (a new MemoryDatabase). Returns one Comparison per served task; []
    when this host cannot run the target's code (the records are then kept as they are)."""
    import tvm
    from tvm import relax

    from .. import pipeline
    from ..errors import TargetError
    from ..timing import TimingCache, measure_paired, random_inputs, start_tvm_pool
    from ..targets.registry import check_host_can_run
    from .tasks import extract_tasks

    if hw.device != "cpu":
        return []
    try:
        check_host_can_run(hw.device, hw.arch, hw.features)
    except TargetError:
        return []
    target = hw.to_tvm()
    cache = cache or TimingCache()
    sites = _call_sites(fused_mod)
    served, todo, timed = {}, [], {}
    for task in extract_tasks(fused_mod, target):
        rec = replay.db.query_tuning_record(task.mod, target, task.name)
        if rec is None or task.name not in sites:
            continue
        served[task.name] = (task, rec)
        key = _key(task.mod, rec, target)
        hit = cache.get(key, ("tuned_ms", "default_ms", "ratio"))
        if hit is not None:
            timed[task.name] = (*hit, True)
        else:
            todo.append(task.name)
    if todo:
        sized = start_tvm_pool()  # both sides run on TVM's pool, as the artifact does
        mod = tvm.IRModule()
        names = {}
        for i, name in enumerate(todo):
            gv, call = sites[name]
            func = _wrapper(gv, call)
            if func is None:
                continue
            mod[gv] = fused_mod[gv]
            fname = f"tvmopt_task_{i}"
            mod[fname] = func.with_attr("global_symbol", fname)
            names[name] = fname
        rng = np.random.default_rng(0)
        dev = tvm.cpu()
        tuned_cfg = pipeline.PipelineConfig(dispatch="codegen", database=replay.db,
                                            weight_prepack=weight_prepack, channels_last=False)
        default_cfg = pipeline.PipelineConfig(dispatch="codegen", channels_last=False)
        with pipeline.unrecorded(), tempfile.TemporaryDirectory(prefix="tvmopt-prefer-") as tmp:
            vms = {}
            for side, cfg in (("tuned", tuned_cfg), ("default", default_cfg)):
                ex = pipeline.build(mod, target, cfg, start_after=pipeline.FRONT_HALF)
                path = f"{tmp}/{side}.so"
                ex.export_library(path)  # loaded as an artifact is
                vms[side] = relax.VirtualMachine(tvm.runtime.load_module(path), dev)
            for name, fname in names.items():
                inputs = [tvm.runtime.tensor(a, dev) for a in random_inputs(mod[fname], rng)]
                pair = measure_paired(vms["tuned"][fname], vms["default"][fname], inputs)
                timed[name] = (pair.a_ms, pair.b_ms, pair.ratio, False)
                # A busy machine's verdict is not kept, nor one from a pool of another size.
                if pair.trusted and sized:
                    task, rec = served[name]
                    cache.put(_key(task.mod, rec, target), name, tuned_ms=pair.a_ms,
                              default_ms=pair.b_ms, ratio=pair.ratio)
        cache.save()
    out, drop = [], []
    for name, (task, rec) in served.items():
        if name not in timed:
            out.append(Comparison(name, None, None, True))  # not timeable here: kept
            continue
        t_ms, d_ms, ratio, cached = timed[name]
        kept = ratio < KEEP_BELOW
        if not kept:
            drop.append(task.mod)
        out.append(Comparison(name, round(t_ms, 4), round(d_ms, 4), kept, cached,
                              round(ratio, 4)))
    if drop:
        replay.db = _without(replay.db, drop)
    return out


def _without(db, mods):
    """A MemoryDatabase holding `db`'s records except those of the given task modules."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    hashes = {tvm_ffi.structural_hash(m) for m in mods}
    new = ms.database.MemoryDatabase()
    for rec in db.get_all_tuning_records():
        wmod = rec.workload.mod
        if tvm_ffi.structural_hash(wmod) in hashes and any(
                tvm_ffi.structural_equal(wmod, m) for m in mods):
            continue
        wl = new.commit_workload(wmod)
        new.commit_tuning_record(ms.database.TuningRecord(
            rec.trace, wl, rec.run_secs, rec.target, rec.args_info))
    return new
