"""`tvmopt tune`: tune a model's fused functions into a resumable database folder.

Tasks are extracted from exactly the module `compile` builds with the same options: the front
half (tvmopt.front: layout, library dispatch, precision plan, through fusion), which is what the
compile pipeline's "database" phase looks up, so a replay hits the functions that were tuned
(apache/tvm#19385 missed by applying too early). Kernels handed to oneDNN are no tasks.

Each task's default schedule is measured first and committed as a record (tuning/seed.py), so
the search starts from it and a task's best record is never slower than the untuned build's.
The budget is trials (`--trials`), wall-clock minutes (`--minutes`) or both, shared out by
MetaSchedule's gradient task scheduler by each task's share of the model's time.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TuningError
from .database import (MANIFEST_FILE, RECORD_FILE, SanitizeReport, atomic_write,
                       json_roundtrip, valid_secs, check_record_targets, check_target,
                       check_tvm_version, db_dispatch, locked, open_json_database, read_manifest,
                       recorded_library_choices, sanitize_files)
from .interrupt import CtrlC
from .library import (LibraryTime, ceiling, library_time, per_call_ms, probe_rates,
                      recorded_library_ms)
from .measure import (close_runner, load_target_intrinsics, make_builder, make_runner,
                      parse_host_port)
from .retime import SideBySide
from .select import parse_selection, slowest
from .tasks import SCHEDULED, Task, extract_tasks

# Trials a task gets per round when the budget is minutes (the trial count is open).
_PER_ROUND_TIMED = 16
# Below this share of the budget spent, the report says per task why the rest was not.
SPENT_ENOUGH = 0.9
# A floor of tuned / untuned latency from which tune says tuning has little to work on.
_LITTLE_TO_TUNE = 0.95


@dataclass
class GateOutcome:
    """What compile's accuracy gate decided for a build whose library calls compute in a lower
    precision (bf16): the workloads it gave back to fp32, and whether it gave the lower
    precision back altogether. Each changes the module (the casts around a library call fuse
    into its neighbours), so tune's tasks come from the module after the gate."""

    fp32_only: tuple[str, ...] = ()
    all_fp32: bool = False
    lines: tuple[str, ...] = ()  # what the gate printed, attempt by attempt
    # What it was run with (gate_settings): the error limit and the calibration file.
    settings: dict | None = None

    @property
    def changed(self) -> bool:
        return bool(self.fp32_only) or self.all_fp32

    def to_json(self) -> dict:
        return {"fp32_only": list(self.fp32_only), "all_fp32": self.all_fp32,
                **(self.settings or {})}


def gate_settings(max_error: float | None, calibration: str | None) -> dict:
    """The accuracy gate's settings as a manifest records them: the error limit (None: the
    gate's default) and the calibration file's sha256 (None: seeded random inputs)."""
    from ..files import sha256_file

    return {"max_error": max_error,
            "calibration_sha256": sha256_file(calibration) if calibration else None}


def gate_settings_differ(recorded: dict | None, current: dict) -> list[str]:
    """'name: recorded (this run: current)' for each gate setting a database's manifest
    records otherwise ([] where it records none: tuned before they were recorded)."""
    if not recorded or not ({"max_error", "calibration_sha256"} & set(recorded)):
        return []
    names = {"max_error": "--max-error", "calibration_sha256": "--calibration"}
    show = {"max_error": lambda v: "default" if v is None else f"{v:g}",
            "calibration_sha256": lambda v: "seeded random inputs" if v is None
            else f"file sha256 {v[:12]}"}
    return [f"{names[k]} {show[k](recorded.get(k))} (this run: {show[k](current.get(k))})"
            for k in names if recorded.get(k) != current.get(k)]


def fused_module(model_path: str, shapes: dict, hw, weight_prepack: bool = False,
                 dispatch: str = "codegen", notes: list | None = None,
                 precision: str = "auto", database=None, pipeline_opts: dict | None = None,
                 gated: GateOutcome | None = None, pinned: dict | None = None):
    """Import the model and run the front half as `compile` does with the same options.

    With `dispatch` "auto" or "library" the kernels compile would hand to oneDNN are already
    library calls here, so they are no tuning tasks: trials go only to what stays codegen.

    Args:
        database: (MetaSchedule database, content hash) of records already tuned, or None:
            compile's per-kernel dispatch timing builds the codegen side with them, so this
            must too to make the same choices.
        pipeline_opts: filled with the options the module was built under (front.pipeline_options).
        gated: what compile's accuracy gate decided for this model: its fp32 workloads stay
            fp32 here too (they change the fused functions around them).
        pinned: {workload key: precision} of the library calls to make, nothing timed (a
            database's recorded choices, tuning.database.recorded_library_choices).

    Returns:
        (IRModule after fusion, ImportedModel, the dispatch choices)

    Raises:
        TuningError: an input has a symbolic dim (`shapes` must fix it).
    """
    from .. import pipeline
    from ..front import fuse_and_plan, pipeline_options
    from ..frontend import run_time_checks
    from ..frontend.model_file import import_model
    from ..precision.schemes import library_compute

    with run_time_checks.for_device(hw.device):  # as compile imports
        imported = import_model(model_path, shapes)
    _require_static(imported.inputs)  # before the front half's kernel timing, which takes a while
    target = hw.to_tvm()
    compute = library_compute(hw, precision) if dispatch != "codegen" else ("fp32",)
    gated = gated or GateOutcome()
    db, db_id = database if database is not None else (None, "")
    cfg = pipeline.PipelineConfig(weight_prepack=weight_prepack, dispatch=dispatch, hw=hw,
                                  library_compute=("fp32",) if gated.all_fp32 else compute,
                                  fp32_only=frozenset(gated.fp32_only), pinned_library=pinned,
                                  database=db, database_id=db_id)
    front = fuse_and_plan(imported.mod, target, hw, cfg, precision)
    if notes is not None:
        notes.extend(front.records.notes)
    if pipeline_opts is not None:
        pipeline_opts.update(pipeline_options(front.cfg, precision))
    return front.fused, imported, front.records.choices


@dataclass
class TaskResult:
    name: str
    weight: int
    flops: float
    trials: int
    best_s: float | None  # None: no valid measurement yet
    default_s: float | None = None  # the default schedule's time (tuning/seed.py)
    trials_run: int = 0  # measured in this run
    status: str = ""  # why the task got fewer trials than it could have, when it did
    # The best record and the default schedule timed again in the same rounds (retime.py).
    side_by_side: SideBySide | None = None

    @property
    def gflops(self) -> float | None:
        if not self.best_s or not self.flops:
            return None
        return self.flops / self.best_s / 1e9

    @property
    def led(self) -> bool:
        """The search's best record measured faster than the default schedule."""
        return self.best_s is not None and self.default_s is not None and \
            self.best_s < self.default_s

    @property
    def untuned_s(self) -> float | None:
        """The default schedule's time, from the side-by-side rounds where there are some."""
        return self.side_by_side.default_s if self.side_by_side else self.default_s

    @property
    def tuned_s(self) -> float | None:
        """What the tuned build runs: the best record where it beat the default schedule side
        by side, else the default (compile --db drops a record that does not win)."""
        sb = self.side_by_side
        return min(sb.best_s, sb.default_s) if sb else self.best_s

    @property
    def speedup(self) -> float | None:
        sb = self.side_by_side
        if sb:
            return sb.default_s / sb.best_s
        if not self.best_s or not self.default_s:
            return None
        return self.default_s / self.best_s


@dataclass
class TuneResult:
    db_dir: Path
    tasks: list[TaskResult]
    trials_run: int = 0
    trials_before: int = 0
    build_failures: int = 0
    run_failures: int = 0
    sanitized: SanitizeReport = field(default_factory=SanitizeReport)
    wall_s: float = 0.0
    interrupted: bool = False
    seeds: list = field(default_factory=list)  # tuning.seed.Seed measured in this run
    budget_trials: int | None = None  # search trials this run could spend (None: open)
    budget_s: float | None = None  # seconds this run could spend (None: open)
    search_s: float = 0.0  # seconds the search itself ran
    stopped_by: str = ""  # "trials", "time", "Ctrl-C", "exhausted" (every task ended), "none"
    option_changes: list = field(default_factory=list)  # vs the options the db was tuned under
    standby: int = 0  # library kernels recorded with their default schedule (see _standby_tasks)
    library: LibraryTime | None = None  # what the library runs, which tuning does not change
    every_task: bool = True  # False: --tasks slowest:N or --missing-only left some out
    # Cores' worth of CPU other processes used while it measured: "defaults", "search" (the
    # defaults' second measurement where the first was busy).
    foreign_load: dict = field(default_factory=dict)
    extra_default_records: int = 0  # records of the defaults' second measurement

    @property
    def estimate_s(self) -> float | None:
        """Whole-model latency estimate: sum of weight x tuned latency (None if a task has
        none)."""
        if any(t.tuned_s is None for t in self.tasks):
            return None
        return sum(t.weight * t.tuned_s for t in self.tasks)

    @property
    def default_estimate_s(self) -> float | None:
        """The same sum over the default schedules (None if a task's was not measured)."""
        if any(t.untuned_s is None for t in self.tasks):
            return None
        return sum(t.weight * t.untuned_s for t in self.tasks)

    @property
    def retimed(self) -> int:
        """Tasks whose speed-up comes from the side-by-side rounds."""
        return sum(1 for t in self.tasks if t.side_by_side)

    @property
    def untuned_total_s(self) -> float | None:
        """The kernel time per inference of the untuned build: the library's timed calls plus
        the tuned tasks' default schedules (None when either is unknown, or when some of the
        model's tasks were left out of this run)."""
        return self._with_library(self.default_estimate_s)

    @property
    def tuned_total_s(self) -> float | None:
        """The same with the best records in place of the default schedules."""
        return self._with_library(self.estimate_s)

    def _with_library(self, tasks_s: float | None) -> float | None:
        if not self.every_task or tasks_s is None:
            return None
        if self.library is None:
            return tasks_s
        return None if self.library.untimed else self.library.ms / 1e3 + tasks_s

    @property
    def spent(self) -> float | None:
        """Share of the budget spent: the larger of trials and time (None: no budget)."""
        shares = []
        if self.budget_trials:
            shares.append(self.trials_run / self.budget_trials)
        if self.budget_s:
            shares.append(self.search_s / self.budget_s)
        return max(shares) if shares else None


def summarize(db, tasks: list[Task], defaults: dict | None = None) -> list[TaskResult]:
    """Trials and best latency of each task, read from the database; `defaults` maps a task's
    workload hash to its default schedule's seconds (the manifest's "defaults")."""
    import tvm_ffi

    by_hash: dict[int, list] = {}
    for rec in db.get_all_tuning_records():
        by_hash.setdefault(tvm_ffi.structural_hash(rec.workload.mod), []).append(rec)
    out = []
    for t in tasks:
        h = tvm_ffi.structural_hash(t.mod)
        recs = [r for r in by_hash.get(h, []) if tvm_ffi.structural_equal(r.workload.mod, t.mod)]
        secs = [s for s in (valid_secs(r) for r in recs) if s is not None]
        default = ((defaults or {}).get(str(h)) or {}).get("secs")
        out.append(TaskResult(t.name, t.weight, t.flops, len(recs), min(secs) if secs else None,
                              default_s=default))
    return out


# ------------------------------------------------------------------------ tuning
@dataclass
class TuneOptions:
    """What `tvmopt tune` needs.

    Attributes:
        model: path to the .onnx file or torch.export program (.pt2).
        target: target name or alias.
        trials: total trial budget for the database (records already in it count; the
            default schedules measured first do not). None: 64, or open with `minutes`.
        minutes: wall-clock budget of this run's search (None: trials alone). With both, the
            first one reached ends the run.
        precision: as compile's --precision: the plan's rewrites shape the fused functions.
        db: database folder (default: schedules/<model stem>/<target name>/).
        max_trials_per_task: cap per task in this run (default: trials).
        shapes: --shape overrides ('NAME=1x3x96x96' strings or a parsed dict).
        rpc_tracker: 'HOST:PORT' of a TVM RPC tracker; measure on its servers.
        rpc_key: device key the servers registered with.
        trials_per_round: candidates per task per round (default: from the budget).
        seed: random seed of the search.
        weight_prepack: tune with weights marked layout-free (CPU weight prepack); the
            database then only serves compiles with the same setting (taken from its manifest).
        population: evolutionary-search population (TVM's default 512; smaller searches
            faster per round on few cores, at some cost in schedule quality).
        missing_only: tune only the tasks with no valid record yet (e.g. after a pipeline
            change altered some kernels); tasks already served by the database get no trials.
        tasks: "all", or "slowest:N": only the N tasks with the most time per inference under
            the default schedules, timed on this host before tuning (tuning/select.py).
        dispatch: as compile's: with "auto" the kernels that time faster on oneDNN (and with
            "library" every kernel oneDNN takes) are left out of tuning. Compile with the
            same setting, so both make the same choices.
    """

    model: str
    target: str = "x86"
    trials: int | None = None
    minutes: float | None = None
    precision: str = "auto"
    db: str | None = None
    max_trials_per_task: int | None = None
    shapes: dict = field(default_factory=dict)
    rpc_tracker: str | None = None
    rpc_key: str | None = None
    trials_per_round: int | None = None
    seed: int | None = 0
    population: int = 512
    weight_prepack: bool = False
    missing_only: bool = False
    tasks: str | None = None
    dispatch: str | None = None  # None: the database's setting, else as compile's default
    # compile's --max-error / --calibration for the accuracy gate tune runs first.
    max_error: float | None = None
    calibration: str | None = None
    # (dispatch, database folder or None) -> GateOutcome: compile's accuracy gate on this model
    # and these options, run when the front half puts library calls in a lower precision
    # (tvmopt.tune, in interface/tune.py, passes compile's). None: no gate, and the tasks are
    # those of the build before it.
    accuracy_gate: object = None

    def __post_init__(self):
        from ..frontend.onnx_model import parse_shapes

        if isinstance(self.shapes, (list, tuple)):
            self.shapes = parse_shapes(self.shapes)
        if self.trials is None and self.minutes is None:
            self.trials = 64
        if self.trials is not None and self.trials < 0:
            raise TuningError("--trials must be >= 0")
        if self.minutes is not None and self.minutes <= 0:
            raise TuningError("--minutes must be > 0")
        from ..precision.policy import parse as parse_precision

        parse_precision(self.precision)
        if self.max_error is not None and not self.max_error > 0:
            raise TuningError("--max-error must be > 0")
        if self.calibration is not None and not Path(self.calibration).is_file():
            raise TuningError(f"--calibration {self.calibration}: no such file")
        if self.max_trials_per_task is not None and self.max_trials_per_task <= 0:
            raise TuningError("--max-trials-per-task must be > 0")
        if self.rpc_tracker:  # fail before the model is imported and the database touched
            parse_host_port(self.rpc_tracker)
            if not self.rpc_key:
                raise TuningError("--rpc-tracker needs --rpc-key (the key the servers "
                                  "registered with)")
            from .rpc import check_key

            check_key(self.rpc_key)
        if self.db is None:
            from ..targets.registry import get_target

            self.db = str(Path("schedules") / Path(self.model).stem / get_target(self.target).name)
        if self.dispatch is None:  # a database keeps the setting its tasks were extracted under
            from ..pipeline import DEFAULT_DISPATCH

            exists = (Path(self.db) / MANIFEST_FILE).exists()
            self.dispatch = db_dispatch(self.db) if exists else DEFAULT_DISPATCH


def _progress_callback(progress, bar, result: TuneResult, per_task: dict):
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class _Progress(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                  runner_results):
            n = len(measure_candidates)
            result.trials_run += n
            stats = per_task.setdefault(int(task_id), [0, 0, 0, ""])
            stats[0] += n
            for b, r in zip(builder_results, runner_results):
                if b.error_msg:
                    result.build_failures += 1
                    stats[1] += 1
                    stats[3] = stats[3] or b.error_msg
                elif r.error_msg:
                    result.run_failures += 1
                    stats[2] += 1
                    stats[3] = stats[3] or r.error_msg
            progress.update(bar, advance=n, description=(
                f"tuning  fail build {result.build_failures} / run {result.run_failures}"))

    return _Progress()


def _require_static(inputs) -> None:
    """MetaSchedule tunes static shapes (a symbolic one fails deep inside its search)."""
    for i in inputs:
        for k, d in enumerate(i.shape or ()):
            if isinstance(d, str):
                example = "x".join("N" if isinstance(x, str) else str(x) for x in i.shape)
                raise TuningError(f"input '{i.name}' dimension {k} is symbolic ({d}); tuning "
                                  f"needs static shapes: pass --shape {i.name}={example} with N "
                                  "the size to tune for")


def _existing_records(folder: Path, hw):
    """(database, content hash) of the valid records already in `folder`, or None."""
    if not (folder / RECORD_FILE).exists():
        return None
    from .replay import load_database

    loaded = load_database(folder, hw)
    return loaded.db, loaded.sha256


def tune(opts: TuneOptions, console=None) -> TuneResult:
    """Tune `opts.model` into the database folder `opts.db`, continuing from what it holds.

    Records are appended by MetaSchedule as they are measured, so an interrupt or kill keeps
    them; the next run sanitizes the files (a line cut by a kill is dropped and counted),
    counts the existing records against the budget and warm-starts the search from them.

    Raises:
        TuningError: the database is locked, for another target, or the model has no tasks.
    """
    if console is None:
        from rich.console import Console

        console = Console(stderr=True)
    from .. import stage
    from ..files import sha256_file
    from ..front import options_differ
    from ..timing import ForeignLoad, start_tvm_pool

    start_tvm_pool()  # the front half's dispatch and the task ranking time kernels on it

    stage.enter("tuning", str(opts.model))
    from ..targets.registry import get_target

    t0 = time.perf_counter()
    hw = get_target(opts.target)
    _check_measurable(opts, hw)
    target = hw.to_tvm()
    folder = Path(opts.db)
    notes: list = []
    popts: dict = {}
    manifest = read_manifest(folder)
    check_target(folder, manifest, hw)  # before the model's front half, which takes a while
    check_tvm_version(folder, manifest)
    existing = _existing_records(folder, hw)
    # A database tuned before keeps its library choices (made after compile's accuracy gate),
    # so a resumed run tunes the module the records came from, and compile --db builds it.
    pinned = recorded_library_choices(manifest, opts.dispatch) if existing else None
    if pinned is not None:
        console.print(f"library calls as the database recorded them ({len(pinned)} workload(s)"
                      f", nothing timed); a fresh --db decides them again")
    mod, imported, choices = fused_module(opts.model, opts.shapes, hw, opts.weight_prepack,
                                          opts.dispatch, notes, opts.precision, existing, popts,
                                          pinned=pinned)
    lower = [c for c in choices if c.choice == "library" and c.precision not in ("fp32", "int8")]
    if pinned is not None:
        recorded_gate = (manifest.get("pipeline") or {}).get("accuracy_gate")
        if recorded_gate is not None:
            popts["accuracy_gate"] = recorded_gate
        differ = gate_settings_differ(recorded_gate, gate_settings(opts.max_error,
                                                                   opts.calibration))
        if differ:
            console.print(f"note: the database's library calls were gated with other settings "
                          f"({'; '.join(differ)}); this run keeps them as recorded: a fresh "
                          "--db runs the gate with this run's")
        recorded_library_ms(choices, manifest)
    elif lower and opts.accuracy_gate is not None:
        # compile checks such a build against the fp32 reference and gives the lower precision
        # back where the error is over its limit; the tasks must come from the module it keeps.
        console.print(f"{len(lower)} library workload(s) in {lower[0].precision}: running "
                      "compile's accuracy gate, so the tasks come from the module it keeps")
        gated = opts.accuracy_gate(opts.dispatch, str(folder) if existing else None)
        stage.enter("tuning", str(opts.model))  # the gate's compile named its own stages
        for line in gated.lines:
            console.print(line)
        if gated.changed:
            notes.clear()
            mod, imported, choices = fused_module(opts.model, opts.shapes, hw,
                                                  opts.weight_prepack, opts.dispatch, notes,
                                                  opts.precision, existing, popts, gated)
        popts["accuracy_gate"] = gated.to_json()
    for note in notes:
        console.print(f"note: {note}")
    on_library = [c for c in choices if c.choice == "library"]
    library = library_time(choices)
    if library is not None and library.calls > library.untimed and not opts.rpc_tracker:
        # How near oneDNN's calls run to its best on this host: with them there, no search and
        # no other kernel can buy back their share of the time.
        library = library_time(choices, probe_rates(hw, tuple(sorted(
            {c.precision for c in on_library if c.precision in ("fp32", "bf16")}))))
        stage.enter("tuning", str(opts.model))
    if library is not None:
        timed = (f"{library.ms:.3g} ms per inference as the dispatch timed them"
                 + (f", {library.untimed} call(s) untimed" if library.untimed else ""))
        console.print(f"{library.calls} kernels run on oneDNN (--dispatch {opts.dispatch}, "
                      f"{len(on_library)} workloads; {timed}): not tuned")
        if library.of_probe is not None:
            console.print(f"  at {library.gflops:.0f} GFLOP/s they run at "
                          f"{library.of_probe:.0%} of oneDNN's rate on a large matmul on this "
                          f"host ({_rates(library.probe)})")
    left_out: dict = {}
    tasks = extract_tasks(mod, target, left_out)
    for why, names in left_out.items():
        detail = ("a recurrent layer's loop over its steps" if why == SCHEDULED else
                  "an argument's size comes from the data or a shape the import left symbolic; "
                  "MetaSchedule times fixed sizes only")
        console.print(f"{', '.join(names)}: {why} ({detail}), not tuned; tune's time figures "
                      f"leave {'it' if len(names) == 1 else 'them'} out")
    if not tasks:
        raise TuningError(f"{opts.model}: no tunable functions after fusion")
    keep = parse_selection(opts.tasks)
    if keep is not None:
        if opts.rpc_tracker:
            raise TuningError("--tasks slowest:N times kernels on this host; with --rpc-tracker "
                              "the device differs (use --tasks all)")
        tasks, costs = slowest(tasks, hw, keep)
        console.print("tasks by default-schedule time x calls: " + ", ".join(
            f"{c.name} {c.total_ms:.3f} ms" if c.default_ms is not None else f"{c.name} untimed"
            for c in sorted(costs, key=lambda c: -c.total_ms)[:max(keep, 5)]))
        console.print(f"tuning the {len(tasks)} slowest: {', '.join(t.name for t in tasks)}")

    with locked(folder):
        manifest = read_manifest(folder)
        check_target(folder, manifest, hw)
        check_tvm_version(folder, manifest)
        if manifest is not None and bool(manifest.get("weight_prepack")) != opts.weight_prepack:
            raise TuningError(f"database {folder} was tuned with weight_prepack="
                              f"{bool(manifest.get('weight_prepack'))}; rerun with the same "
                              "setting or use another --db")
        sanitized = sanitize_files(folder, folder)
        db = open_json_database(folder)
        check_record_targets(folder, db.get_all_tuning_records(), target)
        before = len(db.get_all_tuning_records())
        result = TuneResult(folder, [], trials_before=before, sanitized=sanitized,
                            library=library)
        if manifest is not None:
            result.option_changes = options_differ(manifest.get("pipeline"), popts)
            if result.option_changes:
                console.print(f"note: {folder} was tuned under other pipeline options ("
                              f"{'; '.join(result.option_changes)}): records of unchanged "
                              "kernels still apply")
        defaults = _current_defaults(manifest, popts["fingerprint"])
        if opts.missing_only:
            tasks = [t for t, r in zip(tasks, summarize(db, tasks)) if r.best_s is None]
        result.every_task = keep is None and not opts.missing_only
        remaining = None if opts.trials is None else max(0, opts.trials - before)
        if not tasks:
            remaining = 0
        result.budget_trials = remaining
        result.budget_s = opts.minutes * 60 if opts.minutes is not None and tasks else None
        _write_manifest(folder, hw, target, opts, sha256_file(opts.model), before, popts,
                        defaults, choices)
        if tasks:
            load_target_intrinsics(target)  # before TuneContext, so it skips the full import
        # The default schedule of each task not yet measured under this pipeline code, and
        # of each kernel oneDNN takes here (standby: a compile on another machine, or with
        # other timings, may keep it on codegen, and then finds its record too).
        standby = _standby_tasks(opts, hw, target, tasks, on_library)
        if standby:
            console.print(f"{len(standby)} standby task(s): kernels on oneDNN here, "
                          "recorded with their default schedule in case a compile keeps "
                          "them on codegen")
        unseeded = [t for t in [*tasks, *standby] if _task_key(t) not in defaults]
        if unseeded and not opts.rpc_tracker:
            console.print(f"measuring the default schedule of {len(unseeded)} task(s) first")
            # A runner of its own: the search's runner must start its workers inside
            # CtrlC (see _search), so they inherit the blocked SIGINT and a Ctrl-C does not
            # kill the batch in flight; workers started here would not have.
            seed_runner = make_runner(None, None, workers=1)
            try:
                _measure_defaults(unseeded, db, hw, target, seed_runner, result, console)
            finally:
                close_runner(seed_runner)
            for t, sd in zip(unseeded, result.seeds):
                defaults[_task_key(t)] = sd.to_json()
            result.standby = len(standby)
            _write_manifest(folder, hw, target, opts, sha256_file(opts.model),
                            len(db.get_all_tuning_records()), popts, defaults, choices)
        if result.every_task:
            _say_ceiling(console, library, tasks, defaults)
        if remaining is None or remaining > 0:
            with ForeignLoad() as load:
                _search(opts, tasks, target, hw, folder, db, remaining, result, console)
            result.foreign_load["search"] = round(load.cores, 2)
        else:
            result.stopped_by = "trials"
        after = len(db.get_all_tuning_records())
        result.trials_run = (after - before - sum(1 for sd in result.seeds if sd.committed)
                             - result.extra_default_records)
        _write_manifest(folder, hw, target, opts, sha256_file(opts.model), after, popts,
                        defaults, choices)
        per_task = result.tasks  # the statuses _search set, by name
        result.tasks = summarize(db, tasks, defaults)
        for t in result.tasks:
            prev = next((p for p in per_task if p.name == t.name), None)
            if prev is not None:
                t.trials_run, t.status = prev.trials_run, prev.status
        if not result.interrupted:
            _retime(opts, hw, target, tasks, db, result, console)
    result.wall_s = time.perf_counter() - t0
    return result


def _measure_defaults(tasks, db, hw, target, runner, result, console) -> None:
    """Measure (and commit as records) the default schedules of `tasks` into result.seeds,
    with the CPU load other processes put on the cores meanwhile."""
    from ..timing import ForeignLoad
    from .seed import seed_defaults

    with ForeignLoad() as load:
        result.seeds = seed_defaults(tasks, db, hw, target, make_builder(workers=1), runner)
    if load.busy:
        # Load only adds time, and these figures are the baseline of every speed-up and of
        # the floor: measured again, each keeps its faster one.
        console.print(f"other processes used {load.cores:.2f} cores while the default "
                      "schedules were measured: measuring them again")
        with ForeignLoad() as load:
            again = seed_defaults(tasks, db, hw, target, make_builder(workers=1), runner)
        result.extra_default_records = sum(1 for sd in again if sd.committed)
        result.seeds = [_faster(a, b) for a, b in zip(result.seeds, again)]
    result.foreign_load["defaults"] = round(load.cores, 2)


def _faster(a, b):
    """Of two measurements of one task's default schedule, the faster (a failed one loses)."""
    if a.secs is None:
        return b
    return b if b.secs is not None and b.secs < a.secs else a


def _retime(opts, hw, target, tasks, db, result, console) -> None:
    """The tasks whose best record beat the default schedule, timed both ways side by side
    (tuning/retime.py): the report's speed-ups are then not a lucky sample's."""
    from .retime import ROUNDS, retime

    n = sum(1 for t in result.tasks if t.led)
    if not n:
        return
    console.print(f"timing the best record of {n} task(s) against the default schedule, "
                  f"{ROUNDS} rounds side by side")
    builder = make_builder(workers=1, link_with=_rpc_linker(hw) if opts.rpc_tracker else None)
    runner = make_runner(opts.rpc_tracker, opts.rpc_key)
    try:
        timed = retime(tasks, result.tasks, db, hw, target, builder, runner)
    finally:
        close_runner(runner)
    for i, sb in timed.items():
        result.tasks[i].side_by_side = sb


def _say_ceiling(console, library, tasks, defaults) -> None:
    """Before the search: how much of the model's kernel time the tasks hold, so a user whose
    model runs almost all on the library knows what tuning can buy before spending the budget."""
    secs = [(defaults.get(_task_key(t)) or {}).get("secs") for t in tasks]
    if library is None or not tasks or any(s is None for s in secs):
        return
    got = ceiling(library, sum(t.weight * s for t, s in zip(tasks, secs)))
    if got is None:
        return
    share, floor = got
    console.print(f"the tuned kernels hold {share:.0%} of this model's timed kernel time, "
                  f"oneDNN the rest: even were they free, the build would take {floor:.2f}x of "
                  "the untuned latency")
    if floor >= _LITTLE_TO_TUNE:
        console.print("note: tuning has little to work on in this build; --dispatch codegen "
                      "(on compile too) leaves every kernel to the search, at the cost of "
                      "oneDNN's kernels")


def _rates(probe: dict) -> str:
    from .library import PROBE_SHAPE

    shape = "x".join(map(str, PROBE_SHAPE))
    return ", ".join(f"{p} {r:.0f} GFLOP/s" for p, r in sorted(probe.items())) + f"; {shape}"


def _rpc_linker(hw) -> str:
    """The C++ compiler that links candidates for an RPC server of `hw`'s arch."""
    from ..targets.cross import cross_cc

    return cross_cc(hw) or "g++"


def _check_measurable(opts, hw) -> None:
    """A foreign-arch CPU target's kernels run only on such a device: refuse to tune it here
    without one, before the model is imported."""
    from ..targets.registry import host_arch

    if hw.device == "cpu" and hw.arch != host_arch() and not opts.rpc_tracker:
        raise TuningError(
            f"target '{hw.name}' is {hw.arch}; its candidates can only be timed on an {hw.arch} "
            f"device: start 'tvmopt rpc tracker' and 'tvmopt rpc server --arch {hw.arch}' (on "
            "the board, or emulated here) and pass --rpc-tracker HOST:PORT --rpc-key KEY")
    if opts.rpc_tracker:
        from .rpc import check_servers

        _rpc_linker(hw)  # the cross compiler, named with its package when missing
        check_servers(opts.rpc_tracker, opts.rpc_key)


def _search(opts, tasks, target, hw, folder, db, remaining, result, console):
    """MetaSchedule's search over `tasks` until the trial or time budget is spent, every task's
    space is exhausted, or Ctrl-C; fills result.tasks with what each task got and why."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)
    from tvm.s_tir import meta_schedule as ms

    cores = int(hw.tvm_dict().get("num-cores", 1))
    budget = remaining if remaining is not None else 10**9  # minutes alone: open trial count
    if opts.trials_per_round:
        per_round = opts.trials_per_round
    elif remaining is None:
        per_round = _PER_ROUND_TIMED
    else:
        per_round = max(4, min(64, remaining // (2 * len(tasks)) or 4))
    cap = opts.max_trials_per_task or budget
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=False)
    per_task: dict[int, list] = {}
    t_start = time.monotonic()
    # A task MetaSchedule's own rules cannot make a design space for would end the whole
    # search with its error: such a task keeps its default-schedule record and is left out.
    no_space = {i: why for i, t in enumerate(tasks)
                if (why := _design_space_error(t, target, hw)) is not None}
    searched = [t for i, t in enumerate(tasks) if i not in no_space]
    if no_space:
        console.print(f"{', '.join(tasks[i].name for i in no_space)}: MetaSchedule's schedule "
                      f"rules fail on {'it' if len(no_space) == 1 else 'them'} "
                      f"({next(iter(no_space.values()))}); default schedule kept, not searched")
    # Ctrl-C is owned by CtrlC from here on (see tuning/interrupt.py): it must be entered
    # before the builder and runner workers start, so they inherit the blocked SIGINT and a
    # terminal's Ctrl-C does not kill a batch in flight. Its safe points also end the run when
    # the time budget is spent.
    with CtrlC(db_dir=folder, console=console) as ctrl_c, progress:
        if opts.minutes is not None:
            ctrl_c.deadline = t_start + opts.minutes * 60
        bar = progress.add_task("tuning", total=remaining)
        contexts, weights = _tune_contexts(searched, target, hw, folder, opts.seed,
                                           opts.population)
        callbacks = [*ms.measure_callback.MeasureCallback.create("default"),
                     _progress_callback(progress, bar, result, per_task),
                     ctrl_c.measure_callback()]
        # Gradient: each round goes to the task whose next trials are expected to cut the
        # model's latency most (its weight x latency and recent improvement).
        ctrl_c.scheduler = ms.task_scheduler.TaskScheduler.create("gradient")
        runner = make_runner(opts.rpc_tracker, opts.rpc_key,
                             workers=2 if opts.rpc_tracker else 1)
        try:
            ctrl_c.checkpoint()  # a Ctrl-C while the contexts were made
            if not searched:
                raise _NothingToSearch
            ms.tune.tune_tasks(
                tasks=contexts, task_weights=weights, work_dir=str(folder),
                max_trials_global=budget, max_trials_per_task=cap,
                num_trials_per_iter=per_round,
                builder=ctrl_c.builder(make_builder(
                    workers=1, link_with=_rpc_linker(hw) if opts.rpc_tracker else None)),
                runner=runner, database=db,
                cost_model=ctrl_c.cost_model(ms.cost_model.XGBModel(
                    num_tuning_cores=cores, tree_method="auto")),
                measure_callbacks=callbacks, task_scheduler=ctrl_c.scheduler)
        except _NothingToSearch:
            pass
        except Exception as err:
            # Our StopTuning comes back as a TVM error (it crossed the FFI).
            if not ctrl_c.is_stop_error(err):
                raise
        finally:
            close_runner(runner)
        result.interrupted = ctrl_c.requested
        timed_out = ctrl_c.stopped and not ctrl_c.requested  # StopTuning at the deadline
    result.search_s = time.monotonic() - t_start
    spent = sum(v[0] for v in per_task.values())
    if result.interrupted:
        result.stopped_by = "Ctrl-C"
    elif timed_out:
        result.stopped_by = "time"
    elif spent >= budget:
        result.stopped_by = "trials"
    else:
        result.stopped_by = "exhausted"
    out = []
    index = {id(t): i for i, t in enumerate(searched)}  # per_task counts by searched index
    for i, task in enumerate(tasks):
        n, bfail, rfail, err = per_task.get(index.get(id(task), -1), [0, 0, 0, ""])
        status = ""
        # Every task is terminated once tune_tasks returns: only a run that ended before its
        # budget says the tasks' own searches ended it.
        if i in no_space:
            status = f"not searched: MetaSchedule's schedule rules fail on it ({no_space[i]})"
        elif result.stopped_by == "exhausted" or (n and bfail + rfail == n):
            status = _why_ended(task, folder, n, bfail, rfail, err, cap)
        elif n == 0 and result.stopped_by in ("trials", "time"):
            status = "no trials: the budget was spent before the task scheduler reached it"
        out.append(TaskResult(task.name, task.weight, task.flops, 0, None, trials_run=n,
                              status=status))
    result.tasks = out


class _NothingToSearch(Exception):
    """Every task's design space failed: the search has nothing to run."""


def _design_space_error(task: Task, target, hw) -> str | None:
    """Why MetaSchedule cannot generate `task`'s design space (a schedule rule raising on the
    fused function, as multi-level tiling's reverse_compute_at on an attention matmul fused
    with its mask's where), or None when it can."""
    from tvm.s_tir import meta_schedule as ms

    from ..errors import error_line

    try:
        ctx = ms.TuneContext(mod=task.mod, target=target, space_generator="post-order-apply",
                             task_name=task.name,
                             num_threads=int(hw.tvm_dict().get("num-cores", 1)))
        ctx.generate_design_space()
    except Exception as err:  # pylint: disable=broad-except
        return error_line(err, default=type(err).__name__)[:160]
    return None


def _why_ended(task, folder: Path, n: int, bfail: int, rfail: int, err: str, cap: int) -> str:
    """Why a task's search ended before its budget, from its counts and its log."""
    from ..errors import error_line

    if n >= cap:
        return f"reached --max-trials-per-task {cap}"
    if n and bfail == n:
        return f"every candidate failed to build: {error_line(err, default='?')[:160]}"
    if n and rfail + bfail == n:
        return f"every candidate failed to run: {error_line(err, default='?')[:160]}"
    hint = _log_hint(folder, task.name)
    if n == 0:
        return "the search produced no candidate" + (f" ({hint})" if hint else "")
    return (f"design space exhausted after {n} trial(s): the search found no unmeasured "
            "candidate" + (f" ({hint})" if hint else ""))


def _log_hint(folder: Path, task_name: str) -> str:
    """The last failure summary MetaSchedule logged for the task (e.g. postprocs rejecting
    every sample), or ''."""
    logs = sorted((folder / "logs").glob(f"*{task_name}*.log")) if (folder / "logs").is_dir() \
        else []
    for log in logs[-1:]:
        lines = log.read_text(errors="replace").splitlines()
        for ln in reversed(lines):
            low = ln.lower()
            if "failure" in low and not low.rstrip().endswith(": 0 failure(s)"):
                return ln.split("]", 1)[-1].strip()[:160]
    return ""


def _standby_tasks(opts, hw, target, tasks, on_library) -> list[Task]:
    """The tasks of the all-codegen front half that the tuned module does not have: the
    kernels handed to oneDNN here, as codegen would run them."""
    import tvm_ffi

    if not on_library or opts.missing_only:
        return []
    mod, _, _ = fused_module(opts.model, opts.shapes, hw, opts.weight_prepack, "codegen",
                             precision=opts.precision)
    have = {_task_key(t) for t in tasks}
    out = []
    for t in extract_tasks(mod, target):
        if _task_key(t) not in have and not any(tvm_ffi.structural_equal(t.mod, u.mod)
                                                for u in out):
            out.append(t)
    return out


def _task_key(task: Task) -> str:
    import tvm_ffi

    return str(tvm_ffi.structural_hash(task.mod))


def _current_defaults(manifest: dict | None, fingerprint: str) -> dict:
    """The manifest's measured default schedules, if measured under this pipeline code (a
    change there may change a task's default schedule, which is then measured again)."""
    m = manifest or {}
    if m.get("defaults_fingerprint") != fingerprint:
        return {}
    return dict(m.get("defaults") or {})


def _tune_contexts(tasks: list[Task], target, hw, folder: Path, seed, population: int = 512):
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.logging import get_loggers_from_work_dir
    from tvm.s_tir.meta_schedule.utils import fork_seed

    cores = int(hw.tvm_dict().get("num-cores", 1))
    contexts, weights = [], []
    # MetaSchedule sizes its console handler from this level: keep the console to warnings
    # (the progress bar and the final table say the rest); DIR/logs/ still gets everything.
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    if not os.environ.get("TVMOPT_DEBUG"):
        ms_logger.setLevel(logging.WARNING)
    # Its logging set-up lists this logger's handlers by name and crashes on an unnamed one
    # (one added by anything else in the process: a test runner, an embedding app); drop those.
    for handler in [h for h in ms_logger.handlers if h.get_name() is None]:
        ms_logger.removeHandler(handler)
    loggers = get_loggers_from_work_dir(str(folder), [t.name for t in tasks])
    for task, logger, rand in zip(tasks, loggers, fork_seed(seed, n=len(tasks))):
        contexts.append(ms.TuneContext(mod=task.mod, target=target,
                                       space_generator="post-order-apply",
                                       search_strategy=ms.search_strategy.EvolutionarySearch(
                                           population_size=population),
                                       task_name=task.name,
                                       logger=logger, rand_state=rand,
                                       num_threads=cores).clone())
        weights.append(float(task.weight))
    return contexts, weights


def _write_manifest(folder: Path, hw, target, opts: TuneOptions, model_sha: str, records: int,
                    popts: dict, defaults: dict, choices):
    import tvm

    from ..targets.registry import target_json

    old = read_manifest(folder) or {}
    manifest = {
        "format": "tvmopt-db/1",
        "target": {"name": hw.name, "tvm_dict": json_roundtrip(hw.tvm),
                   "tvm": target_json(target)},
        "tvm_version": tvm.__version__,
        "model": {"file": Path(opts.model).name, "sha256": model_sha},
        "shapes": {k: list(v) for k, v in opts.shapes.items()},
        "trials": records,
        "trial_budget": opts.trials,
        "minutes": opts.minutes,
        "weight_prepack": opts.weight_prepack,
        "dispatch": opts.dispatch,
        # The options of the module the tasks came from, and the code that built it
        # (tvmopt.front): compile compares them with its own.
        "pipeline": popts,
        "library_kernels": sorted({c.kernel for c in choices if c.choice == "library"}),
        "library_precisions": {c.kernel: c.precision for c in sorted(
            choices, key=lambda c: c.kernel) if c.choice == "library"},
        # each library call's time as the dispatch measured it: a resumed run, which takes the
        # choices above untimed, still reports what oneDNN runs and the floor on tuning
        "library_ms": {c.kernel: ms for c in sorted(choices, key=lambda c: c.kernel)
                       if c.choice == "library" and (ms := per_call_ms(c)) is not None},
        "search": {"strategy": "evolutionary", "population": opts.population,
                   "cost_model": "xgb", "task_scheduler": "gradient",
                   "initial": "default schedules (tuning/seed.py)"},
        # Each task's default schedule as measured (workload hash -> seconds, how).
        "defaults_fingerprint": popts.get("fingerprint"),
        "defaults": defaults,
        "pruned_top_k": old.get("pruned_top_k"),
        "rpc": {"tracker": opts.rpc_tracker, "key": opts.rpc_key} if opts.rpc_tracker else None,
    }
    atomic_write(folder / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
