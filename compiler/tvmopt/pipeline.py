"""The compilation pipeline: an ordered list of named phases, chosen per device by one table.

import -> simplify -> precision -> fusion/legalize -> schedule (database, then dlight) -> lower.
Each phase is a list of Relax/TIR passes; `pass_names()` is what the manifest records.

`optimize(mod, target, cfg, until="fuse")` runs the *front half*: the module after fusion is what
the planner analyses, tuning extracts tasks from and a database is matched against.
`build(fused, target, cfg, start_after="fuse")` continues from it, so one compile runs each phase
once. `record_phases()` lists the phases that run (the hook tests and profiling use).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

from . import fallbacks, stage
from .errors import BuildError, error_line


# Relax VM execution modes. "compiled" removes the interpreter, but VM dispatch is a negligible
# share of a call on the bundled models (tools/profile_overhead.py measures it): default stays.
EXEC_MODES = ("bytecode", "compiled")
# Who computes the heavy CPU kernels (conv2d, matmul): tvmopt's default schedules ("codegen"),
# oneDNN through a tvm-ffi extension wherever a pattern takes the kernel ("library"; the rest
# stays codegen), or "auto": the library where it can be built and loaded, codegen otherwise.
DISPATCH = ("codegen", "library", "auto")
# What compile, plan and tune use unless told: each kernel the faster way on this host. Where
# the library cannot be built or loaded, or the target is not x86, that is the default
# schedules, with a note.
DEFAULT_DISPATCH = "auto"


@dataclass
class PipelineConfig:
    """What the phases need to know beyond the target: what was asked, never what a phase
    decided (that comes back in `Records`).

    Attributes:
        database: a MetaSchedule database to apply after fusion (None: no tuning records).
        precision_passes: passes from the precision planner, run before legalization.
        extra_passes: passes appended to the simplify phase (e.g. tvmopt's own rewrites).
        weight_prepack: CPU layout rewrite: mark weights layout-free before tuning so
            MetaSchedule may choose their layout, then fold the re-layout into the constants
            (static_shape_tuning_pipeline's cpu_weight_prepack). Must match the database.
        dispatch: one of DISPATCH, DEFAULT_DISPATCH as compile uses it. Builds that must run
            the default schedules alone (timing them, planning, accuracy checks) pass
            "codegen", as does `optimize` or `build` given no config.
    """

    database: object | None = None
    database_id: str = ""  # the database's content hash: part of the dispatch timing cache key
    precision_passes: list = field(default_factory=list)
    extra_passes: list = field(default_factory=list)
    weight_prepack: bool = False
    exec_mode: str = "bytecode"
    dispatch: str = DEFAULT_DISPATCH
    # Symbolic dim name -> its largest value (`compile --dim seq=1..512`): memory is planned
    # once for it (passes.dim_bounds).
    dim_upper_bounds: dict = field(default_factory=dict)
    # NHWC convolutions (the default schedules' layout). A tuning database does not change it:
    # `tune` extracts its tasks from the module built with the same options (tvmopt.front).
    channels_last: bool = True
    # Compute precisions a library kernel may run in, each timed ("bf16" where the precision
    # scheme allows it on the target); workloads the accuracy gate keeps in fp32; and whether
    # cached kernel timings are ignored and measured again (`compile --retime`).
    library_compute: tuple = ("fp32",)
    fp32_only: frozenset = frozenset()
    # Workload key -> compute precision of the library calls a database was tuned with:
    # `compile --require-db` builds the module it was tuned on (no timing). None: timed.
    pinned_library: dict | None = None
    retime: bool = False
    # The targets/ entry (targets.registry.HardwareTarget) the default schedules read their
    # vector width and register count from. None: found from the TVM target (its preset,
    # or this host's description), as for the trial builds that carry no entry.
    hw: object | None = None

    def __post_init__(self):
        if self.exec_mode not in EXEC_MODES:
            raise BuildError(f"unknown Relax VM exec_mode '{self.exec_mode}' "
                             f"(choose {' or '.join(EXEC_MODES)})")
        if self.dispatch not in DISPATCH:
            raise BuildError(f"unknown dispatch '{self.dispatch}' (choose {', '.join(DISPATCH)})")

    @property
    def use_channels_last(self) -> bool:
        return self.channels_last


@dataclass
class Records:
    """What the phases decided, returned by `optimize` beside the module.

    Attributes:
        choices: per kernel, library or codegen and in which precision, with the timings
            (precision.choice.Choice), in the order the dispatch made them.
        notes: what the user should hear (e.g. the library could not be loaded).
    """

    choices: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, other: "Records") -> None:
        self.choices.extend(other.choices)
        self.notes.extend(n for n in other.notes if n not in self.notes)


@dataclass
class Step:
    """A phase that decides as well as rewrites: `run(mod) -> (mod, Records)`. The pipeline
    calls it between its pass lists (it is not a TVM pass), and its records come back from
    `optimize`."""

    name: str
    run: Callable


def _simplify(target, cfg):
    from tvm import relax

    from .passes.fold_pad import FoldPadIntoConv
    from .passes.gelu import FuseGelu
    from .passes.power_to_multiply import PowerToMultiply

    # A QDQ model's int8 weights, noted before FoldConstant makes fp32 constants of them: the
    # dispatch phase gives them to oneDNN's int8 kernels.
    record = []
    if cfg.dispatch != "codegen":
        from .precision.choice import is_x86

        if is_x86(target):
            from .library.onednn import RecordQDQWeights

            record = [RecordQDQWeights]
    # PowerToMultiply before FoldConstant: FoldConstant legalizes each power it meets and TVM
    # warns on every pow with exponent >= 3 (the importer has made the exponents constants).
    # FuseGelu after FoldConstant, which makes the formula's constants (sqrt(2) etc.) scalars.
    return [*record, relax.transform.DecomposeOpsForInference(), FoldPadIntoConv,
            relax.transform.CanonicalizeBindings(), PowerToMultiply,
            relax.transform.FoldConstant(), FuseGelu, *cfg.extra_passes]


def _precision(target, cfg):
    return list(cfg.precision_passes)


def _fast_math(target, cfg):
    from .passes.dynamic_quant import ZeroPointZero
    from .passes.fast_math import FastMath
    from .passes.recurrent import LoopRecurrent

    # Legalizes the whole module, static or symbolic: the fast kernels must be built from the
    # same re-derived shapes as their neighbours for FuseTIR to fuse them (see the pass).
    # Recurrent layers no library took (or no dispatch ran) become their loop kernels and
    # plain ops first. ZeroPointZero after the dispatch, whose dynamic int8 patterns read the
    # zero point as imported, and before legalization, while the ops are still ops.
    return [ZeroPointZero, LoopRecurrent, FastMath]


def _layout(target, cfg):
    from .codegen import layout

    if not cfg.use_channels_last:
        return []
    # HWIO: the default schedules' weight packing reads it contiguously along the output
    # channel (OHWI makes those reads strided, far slower); oneDNN takes it as it is.
    return layout.channels_last("HWIO")


def _dispatch_library(target, cfg):
    from .passes.dynamic_quant import DropNonNegativeMin
    from .precision import choice

    if not choice.dispatches(target, cfg.dispatch):
        return [DropNonNegativeMin]  # as before a dispatch: the codegen build is the same module

    def trial_build(mod, **overrides):
        # One side of a kernel timing, built on the default schedules the way the final
        # module may be; its phases and fallbacks are not this compile's (unrecorded).
        with unrecorded():
            return build(mod, target, PipelineConfig(dispatch="codegen", channels_last=False,
                                                     **overrides))

    def run(mod):
        # DropNonNegativeMin before the choice, which takes activations into library calls.
        mod, choices, notes = choice.dispatch(DropNonNegativeMin(mod), target, cfg, trial_build)
        return mod, Records(choices, notes)

    return Step("tvmopt.DispatchLibrary", run)


def _fuse_legalize(target, cfg):
    from tvm import relax

    from .passes.fusion_record import RecordFusedOps, RecordKernelCount
    from .passes.qdq_legalize import legalize_map
    from .passes.recurrent import InlineRecurrent
    from .passes.scalar_params import OpaqueScalarKernels
    from .passes.symbolic_order import OrderSymbolicDefs

    prepack = [relax.transform.AttachAttrLayoutFreeBuffers()] if cfg.weight_prepack else []
    # OrderSymbolicDefs: FuseOps may emit a group before the match_cast defining its dims.
    # The Record* passes note, in module attributes, the kernel count before fusion and the ops
    # of each fused kernel: what the planner reports, read from the fused module alone.
    # legalize_map: relax.quantize with NaN -> the type's minimum, as onnxruntime computes it.
    # InlineRecurrent: the cuda pipeline has no dispatch or fastmath phase to do it.
    # OpaqueScalarKernels: kernels taking a run-time scalar stay unfused (FuseTIR cannot).
    return [InlineRecurrent, relax.transform.LegalizeOps(customize_legalize_map=legalize_map()),
            RecordKernelCount(), relax.transform.AnnotateTIROpPattern(), OpaqueScalarKernels,
            relax.transform.FoldConstant(), relax.transform.FuseOps(), OrderSymbolicDefs(),
            RecordFusedOps(), relax.transform.FuseTIR(), *prepack]


def _apply_database(target, cfg):
    from tvm import relax

    if cfg.database is None:
        return []
    # After fusion, so the records match the fused functions that were tuned (apache/tvm#19385).
    apply = [relax.transform.MetaScheduleApplyDatabase(enable_warning=False)]
    if cfg.weight_prepack:  # weights are constants here: the re-layout folds at compile time
        apply += [relax.transform.SplitLayoutRewritePreproc(), relax.transform.FoldConstant()]
    return apply


def _schedule_cpu(target, cfg):
    from tvm.s_tir import dlight as dl

    from .codegen import cpu
    from .passes.schedule_guard import guarded  # a rule that raises passes the kernel on (recorded)

    # Contractions, pooling and elementwise kernels get register-tiled, parallel, vectorized
    # schedules; reductions the contraction rule declines (softmax, norms) go on to dlight's
    # GEMV/Reduction (GEMV asserts on some fused reductions, e.g. ReduceLogSumExp keepdims).
    # Kernels a database already scheduled are skipped; a kernel no rule takes keeps LLVM's
    # default loop nest: correct, unvectorized.
    params = (cpu.CPUParams.from_hardware(cfg.hw) if cfg.hw is not None
              else cpu.CPUParams.from_target(target))
    rules = [guarded(r) for r in cpu.default_rules(params)]
    # The rules pack weights through layout-rewrite blocks: the params the module passes as
    # constants (noted before), whose copies fold into the constants afterwards.
    return [*cpu.pre_schedule_passes(), dl.ApplyDefaultSchedule(*rules),
            *cpu.post_schedule_passes()]


def _dlight_gpu(target, cfg):
    from tvm.s_tir import dlight as dl

    from .passes.schedule_guard import guarded  # a rule that raises passes the kernel on (recorded)

    return [dl.ApplyDefaultSchedule(guarded(dl.gpu.Matmul()), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                    dl.gpu.GeneralReduction(), dl.gpu.Fallback())]


def _lower(target, cfg):
    from tvm import relax

    from .passes.dim_bounds import SetDimUpperBounds
    from .passes.empty_constants import EmptyConstantsToAllocs

    # The bounds go on before StaticPlanBlockMemory, the pass that reads them.
    bounds = [SetDimUpperBounds(cfg.dim_upper_bounds)] if cfg and cfg.dim_upper_bounds else []
    return [*bounds, relax.transform.RewriteDataflowReshape(), relax.transform.ToNonDataflow(),
            EmptyConstantsToAllocs,
            relax.transform.RemovePurityChecking(), relax.transform.CallTIRRewrite(),
            relax.transform.StaticPlanBlockMemory(), relax.transform.LowerAllocTensor(),
            relax.transform.KillAfterLastUse(), relax.transform.LowerRuntimeBuiltin(),
            relax.transform.ComputePrimValue(), relax.transform.VMShapeLower(),
            relax.transform.AttachGlobalSymbol()]


Phase = tuple[str, Callable]

# The last phase of the front half (see optimize): tuning tasks, the plan and database replay
# all read the module after it.
FRONT_HALF = "fuse"

# The one table of per-device behaviour.
PHASES: dict[str, list[Phase]] = {
    "cpu": [("simplify", _simplify), ("precision", _precision), ("layout", _layout),
            ("dispatch", _dispatch_library), ("fastmath", _fast_math), ("fuse", _fuse_legalize),
            ("database", _apply_database), ("schedule", _schedule_cpu), ("lower", _lower)],
    "cuda": [("simplify", _simplify), ("precision", _precision), ("fuse", _fuse_legalize),
             ("database", _apply_database), ("dlight", _dlight_gpu), ("lower", _lower)],
}


def device_of(target) -> str:
    """The PHASES key for a TVM target: 'cuda' for CUDA, 'cpu' for LLVM."""
    return "cuda" if target.kind.name == "cuda" else "cpu"


def phases(device: str) -> list[Phase]:
    if device not in PHASES:
        raise BuildError(f"no compilation pipeline for device '{device}' "
                         f"(known: {', '.join(PHASES)})")
    return PHASES[device]


def phase_names(device: str) -> list[str]:
    return [name for name, _ in phases(device)]


def front_half(device: str) -> list[str]:
    """The phases up to and including FRONT_HALF."""
    names = phase_names(device)
    return names[: names.index(FRONT_HALF) + 1]


def pass_names(device: str, target, cfg: PipelineConfig) -> dict[str, list[str]]:
    """Phase -> names of the passes it runs, for the manifest."""
    out = {}
    for name, make in phases(device):
        with target:  # MetaScheduleApplyDatabase reads the current target when constructed
            passes = make(target, cfg)
        if isinstance(passes, Step):
            out[name] = [passes.name]
            continue
        out[name] = [getattr(p, "info", None).name if getattr(p, "info", None) else type(p).__name__
                     for p in passes]
    return out


# ------------------------------------------------------------------------ phase-run events
_listeners: list[list[str]] = []


@contextlib.contextmanager
def record_phases():
    """Collect the name of every phase run inside the block, in order.

    Yields:
        The list the names are appended to.
    """
    runs: list[str] = []
    _listeners.append(runs)
    try:
        yield runs
    finally:
        _listeners.remove(runs)


@contextlib.contextmanager
def unrecorded():
    """Phases run inside the block (the compile-time timing builds) are not recorded: trial
    builds are not this compile's pipeline, so neither their phases nor their fallbacks (a
    kernel timed there may end up on the library) belong to its record."""
    saved = list(_listeners)
    _listeners.clear()
    try:
        with fallbacks.paused():
            yield
    finally:
        _listeners.extend(saved)


def _ran(name: str) -> None:
    for runs in _listeners:
        runs.append(name)


# ------------------------------------------------------------------------ drivers
@dataclass
class Optimized:
    """`optimize`'s result: the module and what its phases decided."""

    mod: object
    records: Records


def optimize(mod, target, cfg: PipelineConfig | None = None, until: str | None = None,
             dump: Callable[[str, object], None] | None = None,
             start_after: str | None = None) -> Optimized:
    """Run the phases before `lower` on `mod`; return the optimized IRModule and the records
    of the phases that decide (the library dispatch).

    Args:
        until: stop after this phase (e.g. "fuse": the front half, whose fused functions tuning
            extracts as tasks and the database phase later looks up).
        dump: called as dump(phase_name, mod) after each phase (TVMOPT_SAVE_TEMPS).
        start_after: `mod` already went through the phases up to this one (e.g. "fuse": the
            front half's output); run only the phases after it.
    """
    import tvm

    cfg = cfg or PipelineConfig(dispatch="codegen")
    device = device_of(target)
    todo = phase_names(device)
    if start_after is not None:
        if start_after not in todo:
            raise BuildError(f"no phase '{start_after}' in the {device} pipeline "
                             f"({', '.join(todo)})")
        todo = todo[todo.index(start_after) + 1:]
    ctx_db = cfg.database if cfg.database is not None else None
    records = Records()
    with target:
        for name, make in phases(device):
            if name == "lower":
                break
            if name not in todo:
                continue
            made = make(target, cfg)
            _ran(name)
            stage.enter(f"the {name} phase")
            if isinstance(made, Step):
                mod, decided = made.run(mod)
                records.add(decided)
            elif ctx_db is not None and name == "database":
                with ctx_db:
                    mod = tvm.transform.Sequential(made, name=f"tvmopt.{name}")(mod)
            else:
                mod = tvm.transform.Sequential(made, name=f"tvmopt.{name}")(mod)
            if dump:
                dump(name, mod)
            if name == until:
                break
    return Optimized(mod, records)


def build(mod, target, cfg: PipelineConfig | None = None,
          dump: Callable[[str, object], None] | None = None, start_after: str | None = None):
    """Optimize and compile `mod` to a Relax VM executable. A build that runs the dispatch
    (not one continuing from the front half) drops its records: call `optimize` for them.

    Args:
        start_after: as in `optimize`: "fuse" continues from the front half's output.

    Raises:
        BuildError: TVM failed; the message names the phase.
    """
    import tvm

    cfg = cfg or PipelineConfig(dispatch="codegen")
    device = device_of(target)
    try:
        mod = optimize(mod, target, cfg, dump=dump, start_after=start_after).mod
    except BuildError:
        raise
    except Exception as err:
        raise BuildError(f"optimization failed: {error_line(err)}") from err
    lower = tvm.transform.Sequential(dict(phases(device))["lower"](target, cfg), name="tvmopt.lower")
    _ran("lower")
    try:
        stage.enter("code generation")
        with target:  # TVM's nvcc/nvrtc callback reads the CUDA arch from the current target
            return tvm.relax.build(mod, target=target, relax_pipeline=lower,
                                   exec_mode=cfg.exec_mode)
    except Exception as err:
        raise BuildError(f"code generation for {target.kind.name} failed: "
                         f"{error_line(err)}") from err
