"""Autotuning with MetaSchedule: task extraction after fusion, a 2-core-safe builder, a locked,
resumable, target-checked JSON database, and the report of what tuning found.

The database folder holds MetaSchedule's own two files plus tvmopt's manifest:

    DIR/database_workload.json        one workload (fused PrimFunc) per line
    DIR/database_tuning_record.json   one measured schedule per line, appended as measured
    DIR/tvmopt-db.json                target (name + TVM target), TVM version, model sha256,
                                      input shapes, trials
    DIR/.lock                         fcntl lock held by a running `tvmopt tune`

Tasks are extracted from the module *after* tvmopt's fusion phase (pipeline.optimize(...,
until="fuse")), which is exactly the module the compile pipeline's "database" phase looks up,
so a replay hits the functions that were tuned (apache/tvm#19385 missed by applying too early).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import json
import logging
import os
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TargetError, TvmoptError
from .interrupt import CtrlC

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
MANIFEST_FILE = "tvmopt-db.json"
LOCK_FILE = ".lock"
# The phase after which tasks are extracted and the database is applied (see pipeline.PHASES).
TUNE_AFTER_PHASE = "fuse"
# A failed measurement is stored with this run time by MetaSchedule.
_FAILED_SECS = 1e9


class TuningError(TvmoptError):
    """Tuning could not start or continue (locked database, no tasks, bad database)."""


# ------------------------------------------------------------------------ intrinsics / builder
def _target_intrinsic_modules(target) -> list[str]:
    """The tvm.s_tir.tensor_intrin submodules a target's schedules may tensorize with."""
    kind = target.kind.name
    if kind == "cuda":
        return ["cuda"]
    if kind == "llvm":
        triple = str(target.attrs.get("mtriple", "") or "")
        if triple.startswith(("aarch64", "arm")):
            return ["arm_cpu"]
        if triple.startswith("riscv"):
            return ["riscv_cpu"]
        return ["x86"]  # VNNI/AMX intrinsics; small, and harmless where unused
    return []


def load_target_intrinsics(target) -> list[str]:
    """Register only `target`'s tensor intrinsics, not all of tvm.s_tir.tensor_intrin.

    The package's __init__ parses every family's TVMScript (~39 s on 2 cores, mostly CUDA);
    MetaSchedule imports it in each builder worker and in TuneContext, which makes every build
    time out with the default builder. A bare package object in sys.modules lets the target's
    own submodule load alone. Does nothing if the full package is already imported.

    Returns:
        The submodules imported.
    """
    pkg_name = "tvm.s_tir.tensor_intrin"
    if pkg_name not in sys.modules:
        import tvm.s_tir

        pkg = types.ModuleType(pkg_name)
        pkg.__path__ = [str(Path(tvm.s_tir.__file__).parent / "tensor_intrin")]
        pkg.__package__ = pkg_name
        sys.modules[pkg_name] = pkg
    loaded = []
    for sub in _target_intrinsic_modules(target):
        importlib.import_module(f"{pkg_name}.{sub}")
        loaded.append(sub)
    return loaded


def build_for_tuning(mod, target, _params=None):
    """LocalBuilder f_build: MetaSchedule's default build minus the all-intrinsics import."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    load_target_intrinsics(target)
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm_build(mod, target=target)


def make_builder(timeout_sec: float = 60.0, workers: int = 1):
    """A LocalBuilder that works on a 2-core machine (see load_target_intrinsics)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.builder.LocalBuilder(f_build=build_for_tuning, timeout_sec=timeout_sec,
                                   max_workers=workers)


def alloc_arguments_in_range(device, args_info, alloc_repeat):
    """MetaSchedule's argument allocation, except that integer tensors are zero-filled.

    The default fills every buffer with random bits; as indices of a `take`/gather kernel those
    are out of range, the run fails ("Fast mode segfaults when there are out-of-bounds
    indices"), and the task never gets a valid record. Zero is a valid index for every table.
    """
    import numpy as np
    from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common
    from tvm.s_tir.meta_schedule.utils import get_global_func_with_default_on_worker

    random_fill = get_global_func_with_default_on_worker(
        name="tvm.contrib.random.random_fill_for_measure", default=None)

    def fill(arg):
        if str(arg.dtype).startswith(("int", "uint", "bool")):
            arg.copyfrom(np.zeros(tuple(arg.shape), dtype=str(arg.dtype)))
        else:
            random_fill(arg)

    return alloc_argument_common(fill, device, args_info, alloc_repeat)


def make_runner(rpc_tracker: str | None = None, rpc_key: str | None = None,
                timeout_sec: float = 30.0, workers: int = 1):
    """LocalRunner, or RPCRunner through a tracker ('HOST:PORT') when one is given."""
    from tvm.s_tir import meta_schedule as ms

    evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=40,
                                          enable_cpu_cache_flush=False)
    if not rpc_tracker:
        return ms.runner.LocalRunner(timeout_sec=timeout_sec, evaluator_config=evaluator,
                                     f_alloc_argument=alloc_arguments_in_range)
    host, port = parse_host_port(rpc_tracker)
    if not rpc_key:
        raise TuningError("--rpc-tracker needs --rpc-key (the key the servers registered with)")
    cfg = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=rpc_key,
                              session_timeout_sec=int(timeout_sec))
    return ms.runner.RPCRunner(rpc_config=cfg, evaluator_config=evaluator, max_workers=workers)


def parse_host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port), with a clear error otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise TuningError(f"'{text}': expected HOST:PORT (e.g. 127.0.0.1:9190)")
    return host, int(port)


# ------------------------------------------------------------------------ tasks
@dataclass
class Task:
    """One tuning task: a fused PrimFunc of the model and how often the model calls it."""

    name: str
    weight: int
    mod: object  # IRModule holding the PrimFunc as "main"
    flops: float


def fused_module(model_path: str, shapes: dict, hw, weight_prepack: bool = False):
    """Import the model and run tvmopt's pipeline through the fusion phase.

    Returns:
        (IRModule after fusion, ImportedModel)
    """
    from .. import pipeline
    from ..frontend.importer import import_onnx
    from ..frontend.onnx_model import load_onnx

    imported = import_onnx(load_onnx(model_path), shapes)
    target = hw.to_tvm()
    mod = pipeline.optimize(imported.mod, target, hw.device,
                            pipeline.PipelineConfig(weight_prepack=weight_prepack),
                            until=TUNE_AFTER_PHASE)
    return mod, imported


def extract_tasks(mod, target) -> list[Task]:
    """The tunable fused functions of `mod`, in MetaSchedule's order."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    out = []
    for t in ms.relax_integration.extract_tasks(mod, target):
        work = t.dispatched[0]
        try:
            flops = float(estimate_tir_flops(work))
        except Exception:  # opaque loops (e.g. data-dependent gathers) have no estimate
            flops = 0.0
        out.append(Task(t.task_name, int(t.weight), work, flops))
    return out


# ------------------------------------------------------------------------ database files
@dataclass
class SanitizeReport:
    """What loading a database folder had to drop."""

    workloads: int = 0
    records: int = 0
    bad_workload_lines: int = 0
    bad_record_lines: int = 0

    @property
    def dropped(self) -> int:
        return self.bad_workload_lines + self.bad_record_lines


def _read_lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return path.read_text(errors="replace").splitlines()


def sanitize_files(src: Path, dst: Path) -> SanitizeReport:
    """Copy a database's two files from `src` to `dst` keeping only lines that load.

    Each workload line must deserialize to a Workload and each record line to a TuningRecord
    of a kept workload; anything else (a line cut by a kill, hand edits, a newer format) is
    dropped and counted. Workload indices in records are renumbered to the kept lines.
    """
    from tvm.s_tir import meta_schedule as ms

    rep = SanitizeReport()
    index_map: dict[int, int] = {}
    workloads: list = []
    kept_wl: list[str] = []
    for i, line in enumerate(_read_lines(src / WORKLOAD_FILE)):
        if not line.strip():
            continue
        try:
            wl = ms.database.Workload.from_json(json.loads(line))
        except Exception:
            rep.bad_workload_lines += 1
            continue
        index_map[i] = len(kept_wl)
        kept_wl.append(line)
        workloads.append(wl)
    kept_rec: list[str] = []
    for line in _read_lines(src / RECORD_FILE):
        if not line.strip():
            continue
        try:
            idx, rec = json.loads(line)
            new_idx = index_map[int(idx)]
            ms.database.TuningRecord.from_json(rec, workloads[new_idx])
        except Exception:
            rep.bad_record_lines += 1
            continue
        kept_rec.append(json.dumps([new_idx, rec]))
    dst.mkdir(parents=True, exist_ok=True)
    _atomic_write(dst / WORKLOAD_FILE, "".join(ln + "\n" for ln in kept_wl))
    _atomic_write(dst / RECORD_FILE, "".join(ln + "\n" for ln in kept_rec))
    rep.workloads, rep.records = len(kept_wl), len(kept_rec)
    return rep


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def open_json_database(folder: Path):
    """MetaSchedule's JSONDatabase over `folder` (the files must already be sanitized)."""
    from tvm.s_tir import meta_schedule as ms

    return ms.database.JSONDatabase(path_workload=str(folder / WORKLOAD_FILE),
                                    path_tuning_record=str(folder / RECORD_FILE),
                                    allow_missing=True)


def database_sha256(folder: Path) -> str:
    """One hash over the workload and record files (what a compile replayed)."""
    h = hashlib.sha256()
    for name in (WORKLOAD_FILE, RECORD_FILE):
        p = Path(folder) / name
        h.update(name.encode())
        h.update(p.read_bytes() if p.exists() else b"")
    return h.hexdigest()


def read_manifest(folder: Path) -> dict | None:
    p = Path(folder) / MANIFEST_FILE
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise TuningError(f"{p}: unreadable database manifest ({err})") from None


def check_target(folder: Path, manifest: dict | None, hw) -> None:
    """Refuse a database tuned for another target (MetaSchedule would not notice).

    Raises:
        TargetError: the manifest names another target, or the same name with another TVM target.
    """
    if manifest is None:
        return
    tgt = manifest.get("target", {})
    if tgt.get("name") != hw.name or tgt.get("tvm_dict", hw.tvm) != _json_roundtrip(hw.tvm):
        raise TargetError(
            f"database {folder} was tuned for target '{tgt.get('name')}' "
            f"({tgt.get('tvm_dict')}), not '{hw.name}' ({hw.tvm})",
            hint="tune for this target with `tvmopt tune MODEL --target "
                 f"{hw.name} --db NEW_DIR`")


def _json_roundtrip(obj):
    return json.loads(json.dumps(obj))


@contextlib.contextmanager
def locked(folder: Path):
    """Hold an exclusive fcntl lock on `folder` for one tuning run.

    Raises:
        TuningError: another process holds the lock.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise TuningError(f"database {folder} is being tuned by another process "
                              f"(pid {holder}); wait for it or use another --db") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock


# ------------------------------------------------------------------------ results
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


def _valid_secs(rec) -> float | None:
    if rec.run_secs is None or len(rec.run_secs) == 0:
        return None
    secs = [float(s) for s in rec.run_secs]
    mean = sum(secs) / len(secs)
    return None if mean >= _FAILED_SECS else mean


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
        model: path to the .onnx file.
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

    def __post_init__(self):
        from ..frontend.onnx_model import parse_shape_spec

        if isinstance(self.shapes, (list, tuple)):
            self.shapes = dict(parse_shape_spec(s) for s in self.shapes)
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


def tune(opts: TuneOptions, console=None) -> TuneResult:
    """Tune `opts.model` into the database folder `opts.db`, continuing from what it holds.

    Records are appended by MetaSchedule as they are measured, so an interrupt or kill keeps
    them; the next run sanitizes the files (a line cut by a kill is dropped and counted),
    counts the existing records against the budget and warm-starts the search from them.

    Raises:
        TuningError: the database is locked, for another target, or the model has no tasks.
    """
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)
    from tvm.s_tir import meta_schedule as ms

    from ..frontend.onnx_model import sha256_file
    from ..targets.registry import get_target

    t0 = time.perf_counter()
    hw = get_target(opts.target)
    target = hw.to_tvm()
    folder = Path(opts.db)
    mod, _ = fused_module(opts.model, opts.shapes, hw, opts.weight_prepack)
    tasks = extract_tasks(mod, target)
    if not tasks:
        raise TuningError(f"{opts.model}: no tunable functions after fusion")

    with locked(folder):
        manifest = read_manifest(folder)
        check_target(folder, manifest, hw)
        if manifest is not None and bool(manifest.get("weight_prepack")) != opts.weight_prepack:
            raise TuningError(f"database {folder} was tuned with weight_prepack="
                              f"{bool(manifest.get('weight_prepack'))}; rerun with the same "
                              "setting or use another --db")
        sanitized = sanitize_files(folder, folder)
        db = open_json_database(folder)
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
            # Ctrl-C is owned by CtrlC from here on (see tune_interrupt): it must be entered
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

    from ..build.compile import target_json

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
        "search": {"strategy": "evolutionary", "population": opts.population,
                   "cost_model": "xgb", "task_scheduler": "gradient"},
        "pruned_top_k": old.get("pruned_top_k"),
        "rpc": {"tracker": opts.rpc_tracker, "key": opts.rpc_key} if opts.rpc_tracker else None,
    }
    _atomic_write(folder / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")


def prune(folder: Path, top_k: int = 1) -> tuple[int, int]:
    """Keep only the best `top_k` valid records per workload (for committing a database).

    Returns:
        (records before, records after)
    """
    from tvm.s_tir import meta_schedule as ms

    folder = Path(folder)
    with locked(folder):
        sanitize_files(folder, folder)
        db = open_json_database(folder)
        before = len(db.get_all_tuning_records())
        with tempfile.TemporaryDirectory() as tmp:
            new = open_json_database(Path(tmp))
            by_wl: dict[int, list] = {}
            for rec in db.get_all_tuning_records():
                by_wl.setdefault(_workload_hash(rec.workload), []).append(rec)
            for recs in by_wl.values():
                valid = sorted((r for r in recs if _valid_secs(r) is not None), key=_valid_secs)
                new_wl = new.commit_workload(recs[0].workload.mod)
                for rec in valid[:top_k]:
                    new.commit_tuning_record(ms.database.TuningRecord(
                        rec.trace, new_wl, rec.run_secs, rec.target, rec.args_info))
            after = len(new.get_all_tuning_records())
            for name in (WORKLOAD_FILE, RECORD_FILE):
                os.replace(Path(tmp) / name, folder / name)
        m = read_manifest(folder)
        if m is not None:
            m["pruned_top_k"] = top_k
            m["records_kept"] = after
            _atomic_write(folder / MANIFEST_FILE, json.dumps(m, indent=2) + "\n")
    return before, after


def _workload_hash(workload) -> int:
    import tvm_ffi

    return tvm_ffi.structural_hash(workload.mod)


# ------------------------------------------------------------------------ replay (compile --db)
@dataclass
class Replay:
    """A database opened for compile, and which tasks it serves."""

    db: object
    folder: Path
    sha256: str
    hits: list[str]
    misses: list[str]
    sanitized: SanitizeReport
    manifest: dict | None

    @property
    def weight_prepack(self) -> bool:
        return bool((self.manifest or {}).get("weight_prepack"))

    @property
    def hit_rate(self) -> float:
        total = len(self.hits) + len(self.misses)
        return len(self.hits) / total if total else 1.0

    def to_json(self) -> dict:
        return {"database": str(self.folder), "sha256": self.sha256,
                "tasks": len(self.hits) + len(self.misses), "hits": len(self.hits),
                "hit_rate": round(self.hit_rate, 4), "misses": self.misses,
                "skipped_lines": self.sanitized.dropped,
                "weight_prepack": self.weight_prepack,
                "db_trials": (self.manifest or {}).get("trials"),
                "db_shapes": (self.manifest or {}).get("shapes")}


def open_for_replay(folder: str | Path, hw, fused_mod) -> Replay:
    """Open a database read-only (sanitized into memory) and match it to the fused module.

    Raises:
        TuningError: the folder does not exist or holds no database.
        TargetError: the database was tuned for another target.
    """
    folder = Path(folder)
    if not (folder / RECORD_FILE).exists():
        raise TuningError(f"{folder}: no tuning database here (expected {RECORD_FILE})",
                          hint="create one with `tvmopt tune MODEL --db DIR`")
    manifest = read_manifest(folder)
    check_target(folder, manifest, hw)
    target = hw.to_tvm()
    with tempfile.TemporaryDirectory() as tmp:
        rep = sanitize_files(folder, Path(tmp))
        # Copy into memory so the temp files can go and a read-only DB folder is never written.
        src = open_json_database(Path(tmp))
        from tvm.s_tir import meta_schedule as ms

        db = ms.database.MemoryDatabase()
        for rec in src.get_all_tuning_records():
            if _valid_secs(rec) is None:
                continue  # a failed measurement is no schedule to replay
            wl = db.commit_workload(rec.workload.mod)
            db.commit_tuning_record(ms.database.TuningRecord(
                rec.trace, wl, rec.run_secs, rec.target, rec.args_info))
    hits, misses = [], []
    for task in extract_tasks(fused_mod, target):
        rec = db.query_tuning_record(task.mod, target, task.name)
        (hits if rec is not None else misses).append(task.name)
    return Replay(db, folder, database_sha256(folder), hits, misses, rep, manifest)


def replay_database(folder: str | Path, hw, imported_mod, require: bool = False,
                    cfg=None) -> Replay:
    """Open `folder` for `compile --db`: match it against the module after fusion.

    Args:
        cfg: the compile's PipelineConfig (its precision passes shape the fused functions);
            its database and weight_prepack are ignored here.

    Raises:
        TuningError: with `require`, any task the database does not serve (named).
    """
    import dataclasses

    from .. import pipeline

    prepack = bool((read_manifest(Path(folder)) or {}).get("weight_prepack"))
    base = cfg if cfg is not None else pipeline.PipelineConfig()
    fused = pipeline.optimize(imported_mod, hw.to_tvm(), hw.device,
                              dataclasses.replace(base, database=None, weight_prepack=prepack),
                              until=TUNE_AFTER_PHASE)
    replay = open_for_replay(folder, hw, fused)
    if require and replay.misses:
        raise TuningError(
            f"--require-db: database {replay.folder} has no schedule for "
            f"{len(replay.misses)} of {len(replay.hits) + len(replay.misses)} tasks: "
            f"{', '.join(replay.misses)}",
            hint="tune them with `tvmopt tune MODEL --db DIR` using the same --shape")
    return replay


def bundled_db_dir(model_name: str, target_name: str) -> Path:
    """Where the committed database of a bundled model lives."""
    from .._data import data_dir

    return data_dir("schedules") / model_name / target_name
