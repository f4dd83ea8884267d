"""The compile API: ONNX or torch.export file -> Relax -> optimized, built artifact (+ optional verification)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import stage
from ..errors import BuildError, ShapeError, TvmoptError, error_line
from ..frontend.onnx_model import parse_shapes
from ..pipeline import DEFAULT_DISPATCH
from ..precision.policy import parse as parse_precision
from ..runtime.verify import Tolerance
from ..targets.cross import cross_cc
from ..targets.registry import HardwareTarget, get_target, target_json
from ..tuning.database import db_dispatch, db_weight_prepack, recorded_library_choices


@dataclass
class CompileOptions:
    """Everything `compile` needs, validated on construction.

    Attributes:
        model: path to the .onnx file, or a `torch.export.save`d program (.pt2).
        target: target name or alias from targets/ (or 'host').
        output: artifact folder (default: <model stem>.tvmopt next to the model).
        shapes: --shape overrides, 'NAME=1x3x224x224' strings or parsed dict.
        verify: compare with the reference after building (onnxruntime; torch for a .pt2).
        tolerance: verification tolerance.
        verify_dims: values for symbolic dims during verification (a ranged dim without
            one: its upper bound, the size the memory plan must hold).
        dim_bounds: symbolic dim name -> (lo, hi), the values the artifact accepts; memory is
            planned once for hi, and the loader refuses an input outside the range.
        save_temps: folder to dump the IR after each phase (TVMOPT_SAVE_TEMPS).
        db: MetaSchedule database folder (from `tvmopt tune`) to replay after fusion.
        require_db: fail if the database misses any task instead of falling back to dlight.
        dispatch: CPU conv2d/matmul by "auto" (the default: each kernel timed both ways on
            this host, the faster kept), "codegen" (default schedules) or "library" (oneDNN
            wherever it takes the kernel); see tvmopt.pipeline.DISPATCH.
        allow_newer_opset: import an opset newer than the importer knows (recorded).
        max_elements: the largest tensor a shape read from the inputs may ask for; a request
            past it is refused at run time before allocating (None: the default,
            frontend.run_time_checks.DEFAULT_MAX_ELEMENTS).
    """

    model: str
    target: str = "x86"
    output: str | None = None
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    verify: bool = False
    tolerance: Tolerance = field(default_factory=Tolerance)
    verify_dims: dict[str, int] = field(default_factory=dict)
    dim_bounds: dict[str, tuple[int, int]] = field(default_factory=dict)
    save_temps: str | None = None
    # "auto" or a precision from tvmopt.precision.policy.CHOICES. max_error: the accuracy
    # gate's limit (interface.gate: max |out - ref| / max |ref|); None: its default for bf16
    # library kernels, none for the other lower precisions (their error is reported).
    precision: str = "auto"
    max_error: float | None = None
    calibration: str | None = None  # .npz of sample inputs for the gate
    retime: bool = False  # measure kernel timings again instead of reading the cache
    db: str | None = None
    require_db: bool = False
    # None: the setting the database was tuned with (its tasks were extracted under it, so
    # only then do its records match), else DEFAULT_DISPATCH.
    dispatch: str | None = None
    allow_newer_opset: bool = False
    max_elements: int | None = None

    def __post_init__(self):
        from ..pipeline import DISPATCH

        if self.dispatch is None:
            self.dispatch = db_dispatch(self.db) if self.db else DEFAULT_DISPATCH
        if self.dispatch not in DISPATCH:
            raise TvmoptError(f"unknown dispatch '{self.dispatch}' (choose {', '.join(DISPATCH)})")
        if isinstance(self.shapes, (list, tuple)):
            self.shapes = parse_shapes(self.shapes)
        parse_precision(self.precision)
        for name, (lo, hi) in self.dim_bounds.items():
            if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
                raise ShapeError(f"dim '{name}': range {lo}..{hi} is not 1 <= LO <= HI")
            value = self.verify_dims.setdefault(name, hi)
            if not lo <= value <= hi:
                raise ShapeError(f"dim '{name}': --verify value {value} is outside its range "
                                 f"{lo}..{hi}")
        if self.output is None:
            self.output = str(Path(self.model).with_suffix(".tvmopt"))
        if self.save_temps is None:
            self.save_temps = os.environ.get("TVMOPT_SAVE_TEMPS") or None


@dataclass
class _Build:
    """One build of the model: the config it ran under, its precision plan, the database
    replay, the executable, and what the dispatch decided."""

    cfg: object
    plan: object
    replay: object | None
    ex: object
    records: object


@dataclass
class CompileResult:
    artifact: object
    timings: dict[str, float]
    verification: list | None = None
    replay: object | None = None  # tuning.Replay when compiled with --db
    gate: object | None = None  # interface.gate.GateRecord when a lower precision was checked


def _pinned_library(manifest: dict | None, opts) -> dict | None:
    """The library calls the database was tuned with, and their precisions, taken as recorded
    (tuning.database.recorded_library_choices): tune's choices are the ones its records fit,
    taken after compile's accuracy gate. None: choose by timing (--retime without
    --require-db, another dispatch mode, or a database that did not record them; an older
    manifest without precisions only under --require-db, which asks for the exact module)."""
    if opts.retime and not opts.require_db:
        return None
    return recorded_library_choices(manifest, opts.dispatch, any_precision=opts.require_db)


def _dumper(folder: str | None):
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    counter = iter(range(100))

    def dump(phase, mod):
        (Path(folder) / f"{next(counter):02d}-{phase}.py").write_text(mod.script(show_meta=False))

    return dump


def compile_model(opts: CompileOptions, log=print) -> CompileResult:
    """Import, optimize, build and write an artifact for `opts.model`.

    One front half per compile: the model is imported once and the pipeline runs up to and
    including `fuse` once; that fused module is what the planner prices, the database is matched
    against and the build continues from. Only a plan that rewrites precision (fp16, int8
    weights, integer matmuls in fp32) runs precision..fuse again, since its Relax rewrites must
    come before legalization.

    Raises:
        TvmoptError: any user-facing failure (model, op, shape, target, build, verification).
    """
    from .. import fallbacks
    from ..timing import start_tvm_pool

    # Before any kernel runs: the pool is sized once, and the compile-time timings on it
    # (tuned records against default schedules) must see the artifact's thread count.
    start_tvm_pool()
    # Every fallback this compile's own pipeline takes is recorded; the manifest lists them.
    with fallbacks.collect() as events:
        return _compile_model(opts, log, events)


def _compile_model(opts: CompileOptions, log, events) -> CompileResult:
    from .. import fallbacks, pipeline
    from ..frontend import model_file
    from ..front import CODE_CHANGED, fuse_and_plan, options_differ, pipeline_options
    from ..precision.schemes import library_compute
    from ..runtime.artifact import write_artifact
    from .accuracy import accuracy_report, own_arithmetic_report
    from .manifest import cuda_report, fallbacks_manifest, kernels_manifest, precision_manifest

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    hw: HardwareTarget = get_target(opts.target)
    cc = cross_cc(hw)  # a missing cross compiler fails now, not after the build
    if hw.device == "cuda":
        from ..targets.cuda import enable_cuda_codegen

        enable_cuda_codegen()
    stage.enter("import", opts.model)
    model = model_file.load(opts.model)
    from ..frontend import run_time_checks

    with run_time_checks.for_device(hw.device, opts.max_elements):
        imported = model_file.import_loaded(model, opts.shapes, opts.allow_newer_opset)
    timings["import_s"] = time.perf_counter() - t0
    _check_dim_names(opts.dim_bounds, imported.inputs)
    from ..frontend.onnx_model import nonfinite_weights

    import onnx

    bad_weights = nonfinite_weights(model) if isinstance(model, onnx.ModelProto) else []
    for w in bad_weights:
        log(f"warning: {w}")

    target = hw.to_tvm()
    dump = _dumper(opts.save_temps)
    # A database's records were tuned with or without weight prepack; the front half must match.
    prepack = db_weight_prepack(opts.db) if opts.db else False
    # Library kernels may compute in a lower precision where the scheme allows it on this
    # target (bf16 on AMX / AVX512-BF16); each is timed, and the accuracy gate checks the model.
    compute = library_compute(hw, opts.precision) if opts.dispatch != "codegen" else ("fp32",)

    def config(fp32_only=frozenset(), fp32=False):
        # The same options with or without a database: `tune` extracts its tasks from this
        # very module (tvmopt.front), so nothing is switched off for the records to match.
        return pipeline.PipelineConfig(weight_prepack=prepack, dispatch=opts.dispatch,
                                       library_compute=("fp32",) if fp32 else compute,
                                       fp32_only=frozenset(fp32_only), retime=opts.retime,
                                       hw=hw, dim_upper_bounds={k: hi for k, (_, hi)
                                                                in opts.dim_bounds.items()})

    cfg = config()
    loaded = None
    if opts.db:
        from ..tuning.replay import load_database

        # Opened before the front half: its manifest's library choices feed the dispatch, and
        # where the dispatch times (--retime) it builds the codegen side with the records, so
        # a tuned kernel competes with oneDNN as it will run.
        t_db = time.perf_counter()
        loaded = load_database(opts.db, hw)
        timings["database_s"] = time.perf_counter() - t_db

    def build_all(cfg, log) -> _Build:
        """Front half, plan, database replay and build under `cfg`."""
        if loaded is not None:
            cfg = replace(cfg, database=loaded.db, database_id=loaded.sha256,
                          pinned_library=_pinned_library(loaded.manifest, opts))
        # Front half, then the plan of its fp32 kernels: the roofline picks the precision per
        # target (and the library kernels' timing, which ran in the front half, the precision
        # of each library call).
        t_plan = time.perf_counter()
        try:
            front = fuse_and_plan(imported.mod, target, hw, cfg, opts.precision,
                                  dims=opts.verify_dims, dump=dump, log=log)
        except BuildError:
            raise
        except Exception as err:
            raise BuildError(f"optimization failed: {error_line(err)}") from err
        timings["plan_s"] = timings.get("plan_s", 0.0) + time.perf_counter() - t_plan
        fused, plan, cfg = front.fused, front.plan, front.cfg

        # Tuning database: matched against the fused module the "database" phase will see.
        replay = None
        if opts.db:
            from ..timing import TimingCache
            from ..tuning.prefer import prefer_default_where_faster
            from ..tuning.replay import replay_database

            t_db = time.perf_counter()
            replay = replay_database(opts.db, hw, fused, opts.require_db, loaded=loaded)
            replay.option_changes = options_differ((replay.manifest or {}).get("pipeline"),
                                                   pipeline_options(cfg, opts.precision))
            # Changed code alone is news only where a task lost its record: the hits are the
            # task-by-task check the fingerprint stands in for.
            if replay.option_changes and (replay.misses
                                          or replay.option_changes != [CODE_CHANGED]):
                log(f"note: database {opts.db} was tuned under other pipeline options ("
                    f"{'; '.join(replay.option_changes)}): records of unchanged kernels still "
                    f"apply ({len(replay.hits)} of {len(replay.hits) + len(replay.misses)} tasks)"
                    + (f"; `tvmopt tune MODEL --db {opts.db} --missing-only` tunes the other "
                       f"{len(replay.misses)}" if replay.misses else ""))
            with fallbacks.paused():  # its trial builds are not the artifact's
                replay.compared = prefer_default_where_faster(
                    replay, hw, fused, prepack, cache=TimingCache(read=not opts.retime))
            cfg = replace(cfg, database=replay.db)
            dropped = [c.task for c in replay.compared if not c.kept]
            if replay.compared:
                log(f"database: {len(replay.compared) - len(dropped)} of {len(replay.compared)} "
                    f"tuned records measure faster than the default schedule here and are used"
                    + (f"; default schedule kept for {', '.join(dropped)}" if dropped else ""))
            timings["database_s"] += time.perf_counter() - t_db

        t1 = time.perf_counter()
        ex = pipeline.build(fused, target, cfg, dump=dump, start_after=pipeline.FRONT_HALF)
        timings["build_s"] = timings.get("build_s", 0.0) + time.perf_counter() - t1
        return _Build(cfg, plan, replay, ex, front.records)

    def manifest_of(b: _Build):
        cfg, plan, replay = b.cfg, b.plan, b.replay
        m = {
            "model": {**model_file.manifest_entry(opts.model, model, imported,
                                                  opts.allow_newer_opset),
                      "nonfinite_weights": bad_weights},
            "kernels": kernels_manifest(cfg, b.records, replay),
            "tvm_version": _tvm_version(),
            "tvm_ffi_version": _tvm_ffi_version(),
            "target": {"name": hw.name, "device": hw.device, "arch": hw.arch,
                       "features": list(hw.features), "tvm": target_json(target)},
            "inputs": [i.to_json() for i in imported.inputs],
            "outputs": [o.to_json() for o in imported.outputs],
            "shape_overrides": {k: list(v) for k, v in opts.shapes.items()},
            "dim_bounds": {k: list(v) for k, v in {**_program_bounds(imported.mod),
                                                    **opts.dim_bounds}.items()},
            "passes": pipeline.pass_names(hw.device, target, cfg),
            "precision": precision_manifest(plan),
            # what a request's values are checked for when the artifact runs (the checks the
            # import could not settle at compile time), and the size limit compiled in
            "run_time_checks": {"max_elements": opts.max_elements or
                                run_time_checks.DEFAULT_MAX_ELEMENTS,
                                "checks": run_time_checks.listed(imported.mod),
                                **({} if hw.device == "cpu" else {"not_checked": (
                                    f"{hw.device}: indices and sizes from the inputs are not "
                                    "checked (the check kernels run on the host, the tensors "
                                    "on the device)")})},
            "tuning": {"database": None},
            "plan": plan.to_json(),
        }
        if replay is not None:
            m["tuning"] = replay.to_json()
        return m

    b = build_all(cfg, log)
    gate = None
    # Only a precision tvmopt lowered on its own (bf16) is gated: the int8 calls of a QDQ model
    # compute what the model's own quantize/dequantize steps define.
    if any(c.choice == "library" and c.precision in compute and c.precision != "fp32"
           for c in b.records.choices):
        t_gate = time.perf_counter()
        b, gate = _accuracy_gate(opts, imported, b, config, build_all, manifest_of, cc, log)
        timings["gate_s"] = time.perf_counter() - t_gate
        if b.replay is not None:
            from ..tuning.tune import gate_settings, gate_settings_differ

            differ = gate_settings_differ(
                ((b.replay.manifest or {}).get("pipeline") or {}).get("accuracy_gate"),
                gate_settings(opts.max_error, opts.calibration))
            if differ:
                log(f"note: database {opts.db} was tuned behind the accuracy gate with other "
                    f"settings ({'; '.join(differ)}): where this gate gives calls back, "
                    "their tasks miss; tune with the same --max-error and --calibration")
    for note in b.records.notes:
        log(f"note: {note}")
    cfg, plan, replay, ex = b.cfg, b.plan, b.replay, b.ex

    manifest = manifest_of(b)
    if gate is not None:
        manifest["precision"]["gate"] = gate.to_json()
    manifest["fallbacks"], manifest["schedule_fallbacks"] = fallbacks_manifest(events, log)
    extra = {}
    if hw.device == "cuda":
        extra["kernels.cu"], manifest["cuda"] = cuda_report(ex, hw, plan, log)
    t2 = time.perf_counter()
    stage.enter("export")
    art = write_artifact(opts.output, ex, manifest, extra_files=extra, cc=cc)
    timings["export_s"] = time.perf_counter() - t2
    if plan.precision not in ("fp32", "bf16") or any(k.integer_matmul for k in plan.kernels):
        t3 = time.perf_counter()
        if cfg.precision_passes:
            with fallbacks.paused():  # the fp32 reference build is not the artifact's
                accuracy_report(art, imported, cfg, hw, opts, log)
        else:
            # A pre-quantized model built as it is: no rewrite whose error two builds of the
            # graph could show (they would be the same build); --verify checks the artifact.
            own_arithmetic_report(art, opts, log)
        timings["accuracy_s"] = time.perf_counter() - t3
    result = CompileResult(art, timings, replay=replay, gate=gate)
    if opts.verify:
        tol = opts.tolerance
        if gate is not None and gate.result.startswith("kept"):
            # A lower precision passed the gate: verify to the gate's limit, not to fp32's.
            tol = Tolerance(atol=gate.limit, rtol=0.0, relative_to_max=True)
        result.verification = verify_artifact(art.path, opts.model, tol, opts.verify_dims)
    return result


def _check_dim_names(bounds: dict, inputs) -> None:
    """Each ranged dim must be a symbolic dim of the model's inputs."""
    symbolic = sorted({d for i in inputs for d in (i.shape or ()) if isinstance(d, str)})
    unknown = [k for k in bounds if k not in symbolic]
    if unknown:
        raise ShapeError(f"--dim {unknown[0]}: not a symbolic dim of the model's inputs "
                         f"(symbolic dims: {', '.join(symbolic) or 'none'})")


def _program_bounds(mod) -> dict[str, tuple[int, int]]:
    """The ranges the imported program itself gives its dims (a torch.export Dim's min/max).

    The memory plan holds only up to those upper bounds too, so the loader must refuse past
    them as it does past `--dim NAME=LO..HI`.
    """
    from tvm import relax

    main = next((f for gv, f in mod.functions_items()
                 if gv.name_hint == "main" and isinstance(f, relax.Function)), None)
    attrs = dict(main.attrs) if main is not None and main.attrs is not None else {}
    upper = {str(k): int(v) for k, v in dict(attrs.get("tir_var_upper_bound") or {}).items()}
    lower = {str(k): int(v) for k, v in dict(attrs.get("tir_var_lower_bound") or {}).items()}
    return {k: (lower.get(k, 0), hi) for k, hi in upper.items()}


def _accuracy_gate(opts, imported, b: _Build, config, build_all, manifest_of, cc, log):
    """Check a build with lower-precision library kernels against the fp32 reference; give
    the lower precision back kernel by kernel (least time saved first) and rebuild while the
    error is over the limit. Returns the build that passed (or the all-fp32 one) and the record."""
    import tempfile

    from ..runtime.artifact import write_artifact
    from . import gate as g

    prec = next(c.precision for c in b.records.choices
                if c.choice == "library" and c.precision not in ("fp32", "int8"))
    limit = opts.max_error if opts.max_error is not None else g.DEFAULT_MAX_ERROR
    feeds, described = g.sample_inputs(imported, opts)
    rec = g.GateRecord(prec, limit, "--max-error" if opts.max_error is not None else "default",
                       g.METRIC, "", described)
    given_back: list[str] = []
    stage.enter("the accuracy gate")
    with tempfile.TemporaryDirectory(prefix="tvmopt-gate-") as tmp:
        for step in range(g.MAX_FALLBACK_STEPS + 2):
            lower = [c for c in b.records.choices
                     if c.choice == "library" and c.precision == prec]
            if not lower:
                rec.result = f"fp32: {prec} given back on every kernel"
                log(f"precision {prec}: gate: {rec.result}")
                break
            # A fresh path per attempt: a library loaded from a path is not loaded again.
            art = write_artifact(Path(tmp) / f"attempt{step}", b.ex, manifest_of(b), cc=cc)
            err, worst, rec.reference = g.measure(str(art.path), opts.model, feeds)
            ok = err <= limit
            rec.attempts.append(g.Attempt(len(lower), err, ok, worst))
            log(f"precision {prec}: gate: error {err:.3g} ({g.METRIC}, vs {rec.reference} on "
                f"{described} inputs) with {len(lower)} {prec} library workload(s); limit "
                f"{limit:g} ({rec.limit_from}): {'passed' if ok else 'over the limit'}")
            if ok:
                rec.result = f"kept {prec} on {len(lower)} library workload(s)"
                break
            # What runs in the lower precision now, least time saved first: a rebuild re-times
            # kernels whose timings were not cached, so the set can differ from the last one.
            order = g.fallback_order(b.records.choices, prec)
            last = step >= g.MAX_FALLBACK_STEPS
            give = order if last else order[: max(1, (len(order) + 1) // 2)]
            given_back += give
            log(f"precision {prec}: gate: {len(give)} workload(s) back to fp32, rebuilding")
            # The last step takes the lower precision off the table altogether.
            rec.all_fp32 = rec.all_fp32 or last
            b = build_all(config(given_back, fp32=last), lambda s: None)
    rec.fp32_only = list(given_back)
    return b, rec


def accuracy_gate_outcome(model: str, target: str, shapes: dict, precision: str, dispatch: str,
                          db: str | None = None, max_error: float | None = None,
                          calibration: str | None = None):
    """What compile's accuracy gate decides for `model` under these options, for `tune`: its
    tasks must come from the module compile keeps after the gate. A compile as the user's would
    run (no verification; the artifact is thrown away).

    Returns:
        tuning.tune.GateOutcome (empty where no library call was in a lower precision).
    """
    import tempfile

    from ..tuning.tune import GateOutcome, gate_settings

    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tvmopt-tune-gate-") as tmp:
        res = compile_model(CompileOptions(model=model, target=target, shapes=dict(shapes),
                                           precision=precision, dispatch=dispatch, db=db,
                                           max_error=max_error, calibration=calibration,
                                           output=str(Path(tmp) / "gate.tvmopt")),
                            log=lines.append)
    settings = gate_settings(max_error, calibration)
    if res.gate is None:
        return GateOutcome(settings=settings)
    return GateOutcome(tuple(res.gate.fp32_only), res.gate.all_fp32,
                       tuple(ln for ln in lines if ": gate: " in ln), settings)


def verify_artifact(artifact_path, model_path, tol: Tolerance, dims: dict[str, int] | None = None):
    """Run artifact and reference (onnxruntime; torch for a .pt2) on the same random inputs;
    raise past tolerance."""
    from ..runtime import verify
    from ..runtime.artifact import read_artifact, update_manifest
    from ..runtime.loader import load, random_inputs

    stage.enter("verification")
    lm = load(artifact_path)
    feeds = random_inputs(lm.inputs, dims)
    got = lm.run(feeds)
    reference, ref = verify.reference_outputs(str(model_path), feeds)
    errors = verify.compare(got, ref, tol, reference)
    record = {"reference": reference, "atol": tol.atol, "rtol": tol.rtol}
    saturating = (reference == "onnxruntime" and any(e.mismatched for e in errors)
                  and not verify.host_has_vnni()
                  and verify.integer_product_ops(model_path))
    if saturating:
        exact = verify.compare(got, verify.run_reference(str(model_path), feeds), tol)
        if not any(e.mismatched for e in exact):
            worst = max(errors, key=lambda e: e.max_abs)
            record.update(reference="onnx.reference", onnxruntime=verify.to_json(errors),
                          note=f"onnxruntime differs by up to {worst.max_abs:.3g} on this host: "
                               f"its u8 x s8 kernels ({', '.join(sorted(saturating))}) saturate "
                               "int16 pair sums on CPUs without VNNI; tvmopt matches "
                               "onnx.reference's exact integer arithmetic")
            errors = exact
    update_manifest(read_artifact(artifact_path, check_hashes=False),
                    verification={**record, "outputs": verify.to_json(errors)})
    verify.check(errors, tol, record["reference"])
    return errors



def _tvm_version() -> str:
    import tvm

    return tvm.__version__


def _tvm_ffi_version() -> str:
    import tvm_ffi

    return tvm_ffi.__version__


__all__ = ["CompileOptions", "CompileResult", "compile_model", "verify_artifact", "TvmoptError"]
