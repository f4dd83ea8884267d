"""`tvmopt tune`: tune a model's fused functions into a resumable database folder.

Tasks are extracted from the module *after* tvmopt's fusion phase (pipeline.optimize(...,
until="fuse")), which is exactly the module the compile pipeline's "database" phase looks up,
so a replay hits the functions that were tuned (apache/tvm#19385 missed by applying too early).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TuningError
from .database import (MANIFEST_FILE, SanitizeReport, _atomic_write, _json_roundtrip, _valid_secs,
                       check_record_targets, check_target, check_tvm_version, db_dispatch, locked,
                       open_json_database, read_manifest, sanitize_files)
from .interrupt import CtrlC
from .measure import load_target_intrinsics, make_builder, make_runner, parse_host_port
from .select import parse_selection, slowest
from .tasks import TUNE_AFTER_PHASE, Task, extract_tasks


def fused_module(model_path: str, shapes: dict, hw, weight_prepack: bool = False,
                 dispatch: str = "codegen", notes: list | None = None):
    """Import the model and run tvmopt's pipeline through the fusion phase.

    With `dispatch` "auto" or "library" the kernels compile would hand to oneDNN are already
    library calls here, so they are no tuning tasks: trials go only to what stays codegen.

    Returns:
        (IRModule after fusion, ImportedModel, the dispatch choices)
    """
    from .. import pipeline
    from ..frontend.model_file import import_model

    imported = import_model(model_path, shapes)
    target = hw.to_tvm()
    # channels_last=False: the layout compile uses with a database (pipeline.PipelineConfig).
    cfg = pipeline.PipelineConfig(weight_prepack=weight_prepack, channels_last=False,
                                  dispatch=dispatch, hw=hw)
    mod = pipeline.optimize(imported.mod, target, cfg, until=TUNE_AFTER_PHASE)
    if notes is not None:
        notes.extend(cfg.notes)
    return mod, imported, cfg.dispatch_choices


@dataclass
class TaskResult:
    name: str
    weight: int
    flops: float
    trials: int
    best_s: float | None  # None: no valid measurement yet

    @property
    def gflops(self) -> float | None:
        if not self.best_s or not self.flops:
            return None
        return self.flops / self.best_s / 1e9


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

    @property
    def estimate_s(self) -> float | None:
        """Whole-model latency estimate: sum of weight x best latency (None if a task has none)."""
        if any(t.best_s is None for t in self.tasks):
            return None
        return sum(t.weight * t.best_s for t in self.tasks)


def summarize(db, tasks: list[Task]) -> list[TaskResult]:
    """Trials and best latency of each task, read from the database."""
    import tvm_ffi

    by_hash: dict[int, list] = {}
    for rec in db.get_all_tuning_records():
        by_hash.setdefault(tvm_ffi.structural_hash(rec.workload.mod), []).append(rec)
    out = []
    for t in tasks:
        recs = [r for r in by_hash.get(tvm_ffi.structural_hash(t.mod), [])
                if tvm_ffi.structural_equal(r.workload.mod, t.mod)]
        secs = [s for s in (_valid_secs(r) for r in recs) if s is not None]
        out.append(TaskResult(t.name, t.weight, t.flops, len(recs), min(secs) if secs else None))
    return out


# ------------------------------------------------------------------------ tuning
@dataclass
class TuneOptions:
    """What `tvmopt tune` needs.

    Attributes:
        model: path to the .onnx file or torch.export program (.pt2).
        target: target name or alias.
        trials: total trial budget for the database (records already in it count).
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
    trials: int = 64
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

    def __post_init__(self):
        from ..frontend.onnx_model import parse_shapes

        if isinstance(self.shapes, (list, tuple)):
            self.shapes = parse_shapes(self.shapes)
        if self.trials < 0:
            raise TuningError("--trials must be >= 0")
        if self.max_trials_per_task is not None and self.max_trials_per_task <= 0:
            raise TuningError("--max-trials-per-task must be > 0")
        if self.rpc_tracker:  # fail before the model is imported and the database touched
            parse_host_port(self.rpc_tracker)
            if not self.rpc_key:
                raise TuningError("--rpc-tracker needs --rpc-key (the key the servers "
                                  "registered with)")
        if self.db is None:
            from ..targets.registry import get_target

            self.db = str(Path("schedules") / Path(self.model).stem / get_target(self.target).name)
        if self.dispatch is None:  # a database keeps the setting its tasks were extracted under
            from ..pipeline import DEFAULT_DISPATCH

            exists = (Path(self.db) / MANIFEST_FILE).exists()
            self.dispatch = db_dispatch(self.db) if exists else DEFAULT_DISPATCH


def _progress_callback(progress, bar, result: TuneResult):
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class _Progress(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                  runner_results):
            n = len(measure_candidates)
            result.trials_run += n
            result.build_failures += sum(1 for b in builder_results if b.error_msg)
            result.run_failures += sum(1 for b, r in zip(builder_results, runner_results)
                                       if not b.error_msg and r.error_msg)
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
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)
    from tvm.s_tir import meta_schedule as ms

    from .. import stage
    from ..files import sha256_file

    stage.enter("tuning", str(opts.model))
    from ..targets.registry import get_target

    t0 = time.perf_counter()
    hw = get_target(opts.target)
    target = hw.to_tvm()
    folder = Path(opts.db)
    notes: list = []
    mod, imported, choices = fused_module(opts.model, opts.shapes, hw, opts.weight_prepack,
                                          opts.dispatch, notes)
    for note in notes:
        console.print(f"note: {note}")
    on_library = [c for c in choices if c.choice == "library"]
    if on_library:
        console.print(f"{sum(c.sites for c in on_library)} kernels run on oneDNN "
                      f"(--dispatch {opts.dispatch}, {len(on_library)} workloads): not tuned")
    _require_static(imported.inputs)
    tasks = extract_tasks(mod, target)
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
        result = TuneResult(folder, [], trials_before=before, sanitized=sanitized)
        remaining = max(0, opts.trials - before)
        if opts.missing_only:
            tasks = [t for t, r in zip(tasks, summarize(db, tasks)) if r.best_s is None]
            remaining = remaining if tasks else 0
        _write_manifest(folder, hw, target, opts, sha256_file(opts.model), before)
        if remaining > 0:
            load_target_intrinsics(target)  # before TuneContext, so it skips the full import
            per_round = opts.trials_per_round or max(4, min(64, remaining // (2 * len(tasks)) or 4))
            cores = int(hw.tvm_dict().get("num-cores", 1))
            progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                                transient=False)
            # Ctrl-C is owned by CtrlC from here on (see tuning/interrupt.py): it must be entered
            # before the builder and runner exist, so their worker processes inherit the
            # blocked SIGINT and a terminal's Ctrl-C does not kill a batch in flight.
            with CtrlC(db_dir=folder, console=console) as ctrl_c, progress:
                bar = progress.add_task("tuning", total=remaining)
                contexts, weights = _tune_contexts(tasks, target, hw, folder, opts.seed,
                                                   opts.population)
                callbacks = [*ms.measure_callback.MeasureCallback.create("default"),
                             _progress_callback(progress, bar, result),
                             ctrl_c.measure_callback()]
                ctrl_c.scheduler = ms.task_scheduler.TaskScheduler.create("gradient")
                runner = make_runner(opts.rpc_tracker, opts.rpc_key,
                                     workers=2 if opts.rpc_tracker else 1)
                try:
                    ctrl_c.checkpoint()  # a Ctrl-C while the contexts were made
                    ms.tune.tune_tasks(
                        tasks=contexts, task_weights=weights, work_dir=str(folder),
                        max_trials_global=remaining,
                        max_trials_per_task=opts.max_trials_per_task or remaining,
                        num_trials_per_iter=per_round,
                        builder=ctrl_c.builder(make_builder(workers=1)),
                        runner=runner,
                        database=db,
                        cost_model=ctrl_c.cost_model(ms.cost_model.XGBModel(
                            num_tuning_cores=cores, tree_method="auto")),
                        measure_callbacks=callbacks, task_scheduler=ctrl_c.scheduler)
                except Exception as err:
                    # Our StopTuning comes back as a TVM error (it crossed the FFI).
                    if not ctrl_c.is_stop_error(err):
                        raise
                finally:
                    # Shut the runner's worker pool down here, not in a __del__ at exit.
                    if getattr(runner, "pool", None) is not None:
                        runner.pool.shutdown()
                result.interrupted = ctrl_c.requested
        after = len(db.get_all_tuning_records())
        result.trials_run = after - before  # records this run added (exact after a Ctrl-C too)
        _write_manifest(folder, hw, target, opts, sha256_file(opts.model), after)
        result.tasks = summarize(db, tasks)
    result.wall_s = time.perf_counter() - t0
    return result


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


def _write_manifest(folder: Path, hw, target, opts: TuneOptions, model_sha: str, records: int):
    import tvm

    from ..targets.registry import target_json

    old = read_manifest(folder) or {}
    manifest = {
        "format": "tvmopt-db/1",
        "target": {"name": hw.name, "tvm_dict": _json_roundtrip(hw.tvm),
                   "tvm": target_json(target)},
        "tvm_version": tvm.__version__,
        "model": {"file": Path(opts.model).name, "sha256": model_sha},
        "shapes": {k: list(v) for k, v in opts.shapes.items()},
        "trials": records,
        "trial_budget": opts.trials,
        "weight_prepack": opts.weight_prepack,
        "dispatch": opts.dispatch,
        "search": {"strategy": "evolutionary", "population": opts.population,
                   "cost_model": "xgb", "task_scheduler": "gradient"},
        "pruned_top_k": old.get("pruned_top_k"),
        "rpc": {"tracker": opts.rpc_tracker, "key": opts.rpc_key} if opts.rpc_tracker else None,
    }
    _atomic_write(folder / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
