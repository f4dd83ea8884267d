"""The compile API: ONNX or torch.export file -> Relax -> optimized, built artifact (+ optional verification)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import stage
from ..errors import (BuildError, InputValueError, ShapeError, TvmoptError, VerificationError,
                      error_line)
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
            # LO may be 0: a decoder's past is empty at the prefill
            if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi and hi >= 1):
                raise ShapeError(f"dim '{name}': range {lo}..{hi} is not 0 <= LO <= HI, HI >= 1")
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
    """The compile, top to bottom. Precision is decided in one flow: the target's scheme
    offers lower precisions to the library kernels (`library_compute`), the dispatch step times
    each kernel in each precision offered and keeps the faster (`precision.choice`, inside the
    build), the plan prices the rest (`precision.kernel_plan`), and the accuracy gate accepts
    the lower precision or gives it back kernel by kernel (`interface.gate`)."""
    from .. import fallbacks
    from ..runtime.artifact import write_artifact
    from . import gate as accuracy_gate
    from .accuracy import accuracy_report, own_arithmetic_report
    from .manifest import cuda_report, fallbacks_manifest

    c = _Compile(opts, log)
    b = c.build(c.config(), log)
    gate = None
    if accuracy_gate.needed(b.records.choices, c.compute):
        t_gate = time.perf_counter()
        feeds, described = accuracy_gate.sample_inputs(c.imported, opts)

        def rebuild(fp32_only, all_fp32):
            return c.build(c.config(fp32_only, fp32=all_fp32), lambda s: None)

        def attempt(build, path):
            return write_artifact(path, build.ex, c.manifest(build), cc=c.cc).path

        b, gate = accuracy_gate.run(b, model=opts.model, feeds=feeds, described=described,
                                    max_error=opts.max_error, rebuild=rebuild,
                                    write_attempt=attempt, log=log)
        c.timings["gate_s"] = time.perf_counter() - t_gate
        c.note_gate_settings(b)
    for note in b.records.notes:
        log(f"note: {note}")

    manifest = c.manifest(b)
    if gate is not None:
        manifest["precision"]["gate"] = gate.to_json()
    manifest["fallbacks"], manifest["schedule_fallbacks"] = fallbacks_manifest(events, log)
    if any(f.kind == "layout_rewrite" for f in events):
        # The NHWC rewrite was refused and the module kept its layout: say what was built.
        manifest["kernels"]["layout"] = "as imported"
    extra = {}
    if c.hw.device == "cuda":
        extra["kernels.cu"], manifest["cuda"] = cuda_report(b.ex, c.hw, b.plan, log)
    t2 = time.perf_counter()
    stage.enter("export")
    art = write_artifact(opts.output, b.ex, manifest, extra_files=extra, cc=c.cc)
    c.timings["export_s"] = time.perf_counter() - t2
    if b.plan.precision not in ("fp32", "bf16") or any(k.integer_matmul for k in b.plan.kernels):
        t3 = time.perf_counter()
        if b.cfg.precision_passes:
            with fallbacks.paused():  # the fp32 reference build is not the artifact's
                accuracy_report(art, c.imported, b.cfg, c.hw, opts, log)
        else:
            # A pre-quantized model built as it is: no rewrite whose error two builds of the
            # graph could show (they would be the same build); --verify checks the artifact.
            own_arithmetic_report(art, opts, log)
        c.timings["accuracy_s"] = time.perf_counter() - t3
    result = CompileResult(art, c.timings, replay=b.replay, gate=gate)
    if opts.verify:
        tol = opts.tolerance
        if gate is not None and gate.result.startswith("kept"):
            # A lower precision passed the gate: verify to the gate's limit, not to fp32's.
            tol = Tolerance(atol=gate.limit, rtol=0.0, relative_to_max=True)
        result.verification = verify_artifact(art.path, opts.model, tol, opts.verify_dims)
    return result


class _Compile:
    """One compile's inputs, made once: the target, the imported model, the database, the
    precisions the scheme offers; `build` runs the pipeline under a config (again only when the
    gate gives a lower precision back) and `manifest` describes a build."""

    def __init__(self, opts: CompileOptions, log):
        from ..frontend import model_file, run_time_checks
        from ..frontend.onnx_model import nonfinite_weights
        from ..precision.schemes import library_compute

        import onnx

        self.opts, self.log = opts, log
        self.timings: dict[str, float] = {}
        t0 = time.perf_counter()
        self.hw: HardwareTarget = get_target(opts.target)
        self.cc = cross_cc(self.hw)  # a missing cross compiler fails now, not after the build
        if self.hw.device == "cuda":
            from ..targets.cuda import enable_cuda_codegen

            enable_cuda_codegen()
        stage.enter("import", opts.model)
        self.model = model_file.load(opts.model)
        with run_time_checks.for_device(self.hw.device, opts.max_elements):
            self.imported = model_file.import_loaded(self.model, opts.shapes,
                                                     opts.allow_newer_opset)
        self.timings["import_s"] = time.perf_counter() - t0
        _check_dim_names(opts.dim_bounds, self.imported.inputs)
        self.bad_weights = (nonfinite_weights(self.model)
                            if isinstance(self.model, onnx.ModelProto) else [])
        for w in self.bad_weights:
            log(f"warning: {w}")
        self.target = self.hw.to_tvm()
        self.dump = _dumper(opts.save_temps)
        # A database's records were tuned with or without weight prepack; the front half must
        # match.
        self.prepack = db_weight_prepack(opts.db) if opts.db else False
        # The scheme's offer: the precisions a library kernel may compute in on this target
        # (bf16 on AMX / AVX512-BF16); each is timed, and the accuracy gate checks the model.
        self.compute = (library_compute(self.hw, opts.precision)
                        if opts.dispatch != "codegen" else ("fp32",))
        self.loaded = None
        if opts.db:
            from ..tuning.replay import load_database

            # Opened before the front half: its manifest's library choices feed the dispatch,
            # and where the dispatch times (--retime) it builds the codegen side with the
            # records, so a tuned kernel competes with oneDNN as it will run.
            t_db = time.perf_counter()
            self.loaded = load_database(opts.db, self.hw)
            self.timings["database_s"] = time.perf_counter() - t_db

    def config(self, fp32_only=frozenset(), fp32: bool = False):
        """The pipeline config this compile asks for; the gate's rebuilds keep `fp32_only`
        workloads (or, with `fp32`, every one) in fp32. The same options with or without a
        database: `tune` extracts its tasks from this very module (tvmopt.front), so nothing is
        switched off for the records to match."""
        from .. import pipeline

        opts = self.opts
        cfg = pipeline.PipelineConfig(
            weight_prepack=self.prepack, dispatch=opts.dispatch,
            library_compute=("fp32",) if fp32 else self.compute,
            fp32_only=frozenset(fp32_only), retime=opts.retime, hw=self.hw,
            dim_upper_bounds={k: hi for k, (_, hi) in opts.dim_bounds.items()})
        if self.loaded is not None:
            cfg = replace(cfg, database=self.loaded.db, database_id=self.loaded.sha256,
                          pinned_library=_pinned_library(self.loaded.manifest, opts))
        return cfg

    def build(self, cfg, log) -> _Build:
        """Front half, plan, database replay and build under `cfg`."""
        from .. import pipeline
        from ..front import fuse_and_plan

        # Front half, then the plan of its fp32 kernels: the roofline picks the precision per
        # target (and the library kernels' timing, which ran in the front half, the precision
        # of each library call).
        t_plan = time.perf_counter()
        try:
            front = fuse_and_plan(self.imported.mod, self.target, self.hw, cfg,
                                  self.opts.precision, dims=self.opts.verify_dims,
                                  dump=self.dump, log=log)
        except BuildError:
            raise
        except Exception as err:
            raise BuildError(f"optimization failed: {error_line(err)}") from err
        self.timings["plan_s"] = self.timings.get("plan_s", 0.0) + time.perf_counter() - t_plan
        cfg, replay = front.cfg, None
        if self.opts.db:
            replay = self._replay(front.fused, cfg, log)
            cfg = replace(cfg, database=replay.db)
        t1 = time.perf_counter()
        ex = pipeline.build(front.fused, self.target, cfg, dump=self.dump,
                            start_after=pipeline.FRONT_HALF)
        self.timings["build_s"] = self.timings.get("build_s", 0.0) + time.perf_counter() - t1
        return _Build(cfg, front.plan, replay, ex, front.records)

    def _replay(self, fused, cfg, log):
        """The tuning database matched against the fused module the "database" phase will
        see; a record is kept only where it measures faster than the default schedule."""
        from .. import fallbacks
        from ..front import CODE_CHANGED, options_differ, pipeline_options
        from ..timing import TimingCache
        from ..tuning.prefer import prefer_default_where_faster
        from ..tuning.replay import replay_database

        opts = self.opts
        t_db = time.perf_counter()
        replay = replay_database(opts.db, self.hw, fused, opts.require_db, loaded=self.loaded)
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
                replay, self.hw, fused, self.prepack, cache=TimingCache(read=not opts.retime))
        dropped = [c.task for c in replay.compared if not c.kept]
        if replay.compared:
            log(f"database: {len(replay.compared) - len(dropped)} of {len(replay.compared)} "
                f"tuned records measure faster than the default schedule here and are used"
                + (f"; default schedule kept for {', '.join(dropped)}" if dropped else ""))
        self.timings["database_s"] += time.perf_counter() - t_db
        return replay

    def note_gate_settings(self, b: _Build) -> None:
        """Where the database was tuned behind a gate with other settings, say so: where this
        gate gives calls back, their tasks miss."""
        if b.replay is None:
            return
        from ..tuning.tune import gate_settings, gate_settings_differ

        differ = gate_settings_differ(
            ((b.replay.manifest or {}).get("pipeline") or {}).get("accuracy_gate"),
            gate_settings(self.opts.max_error, self.opts.calibration))
        if differ:
            self.log(f"note: database {self.opts.db} was tuned behind the accuracy gate with "
                     f"other settings ({'; '.join(differ)}): where this gate gives calls back, "
                     "their tasks miss; tune with the same --max-error and --calibration")

    def manifest(self, b: _Build) -> dict:
        """The artifact's manifest for build `b` (the gate's attempts carry one too)."""
        from .. import pipeline
        from ..frontend import model_file, run_time_checks
        from .manifest import kernels_manifest, precision_manifest

        opts, hw, imported = self.opts, self.hw, self.imported
        m = {
            "model": {**model_file.manifest_entry(opts.model, self.model, imported,
                                                  opts.allow_newer_opset),
                      "nonfinite_weights": self.bad_weights},
            "kernels": kernels_manifest(b.cfg, b.records, b.replay),
            "tvm_version": _tvm_version(),
            "tvm_ffi_version": _tvm_ffi_version(),
            "target": {"name": hw.name, "device": hw.device, "arch": hw.arch,
                       "features": list(hw.features), "tvm": target_json(self.target)},
            "inputs": [i.to_json() for i in imported.inputs],
            "outputs": [o.to_json() for o in imported.outputs],
            "shape_overrides": {k: list(v) for k, v in opts.shapes.items()},
            "dim_bounds": {k: list(v) for k, v in {**_program_bounds(imported.mod),
                                                    **opts.dim_bounds}.items()},
            "passes": pipeline.pass_names(hw.device, self.target, b.cfg),
            "precision": precision_manifest(b.plan),
            # what a request's values are checked for when the artifact runs (the checks the
            # import could not settle at compile time), and the size limit compiled in
            "run_time_checks": {"max_elements": opts.max_elements or
                                run_time_checks.DEFAULT_MAX_ELEMENTS,
                                "checks": run_time_checks.listed(imported.mod),
                                **({} if hw.device == "cpu" else {"not_checked": (
                                    f"{hw.device}: indices and sizes from the inputs are not "
                                    "checked (the check kernels run on the host, the tensors "
                                    "on the device)")})},
            "tuning": {"database": None} if b.replay is None else b.replay.to_json(),
            "plan": b.plan.to_json(),
        }
        return m


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
    try:
        got = lm.run(feeds)
    except InputValueError as err:
        # The sample inputs, not the build: symbolic dims drawn independently can disagree
        # where the model ties them (a decoder's total = past + seq).
        drawn = sorted({d for i in lm.inputs for d in (i.shape or ()) if isinstance(d, str)})
        sizes = ", ".join(f"{d}={(dims or {}).get(d, 1)}" for d in drawn)
        raise VerificationError(
            f"the verification inputs ({sizes}) are refused by the model: {err}; pass "
            "--dim NAME=N with sizes the model accepts together") from None
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
