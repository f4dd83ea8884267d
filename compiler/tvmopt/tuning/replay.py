"""Replaying a database at compile time (`compile --db`): opened read-only, matched against
the fused module the compile's "database" phase will see."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TuningError
from .database import (RECORD_FILE, SanitizeReport, valid_secs, check_record_targets,
                       check_target, check_tvm_version, database_sha256, open_json_database,
                       read_manifest, sanitize_files)
from .tasks import extract_tasks


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
    # Each served task tuned vs the default schedule on this host (tuning/prefer.py).
    compared: list = field(default_factory=list)
    # The pipeline options the database was tuned under that differ from this compile's
    # (tvmopt.front.options_differ); its records of unchanged kernels still match.
    option_changes: list = field(default_factory=list)

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
                "db_shapes": (self.manifest or {}).get("shapes"),
                "db_pipeline": (self.manifest or {}).get("pipeline"),
                "option_changes": self.option_changes,
                "records_vs_default": [c.to_json() for c in self.compared]}


def load_database(folder: str | Path, hw) -> Replay:
    """Open a database read-only (sanitized into memory), not yet matched to a module: compile
    needs it before its front half, where the per-kernel dispatch timing builds with it.

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
    check_tvm_version(folder, manifest)
    target = hw.to_tvm()
    with tempfile.TemporaryDirectory() as tmp:
        rep = sanitize_files(folder, Path(tmp))
        # Copy into memory so the temp files can go and a read-only DB folder is never written.
        src = open_json_database(Path(tmp))
        from tvm.s_tir import meta_schedule as ms

        db = ms.database.MemoryDatabase()
        records = src.get_all_tuning_records()
        check_record_targets(folder, records, target)
        for rec in records:
            if valid_secs(rec) is None:
                continue  # a failed measurement is no schedule to replay
            wl = db.commit_workload(rec.workload.mod)
            db.commit_tuning_record(ms.database.TuningRecord(
                rec.trace, wl, rec.run_secs, rec.target, rec.args_info))
    return Replay(db, folder, database_sha256(folder), [], [], rep, manifest)


def match(replay: Replay, hw, fused_mod) -> Replay:
    """Fill in which of the fused module's tasks the database serves."""
    target = hw.to_tvm()
    replay.hits, replay.misses = [], []
    for task in extract_tasks(fused_mod, target):
        rec = replay.db.query_tuning_record(task.mod, target, task.name)
        (replay.hits if rec is not None else replay.misses).append(task.name)
    return replay


def open_for_replay(folder: str | Path, hw, fused_mod) -> Replay:
    """Open a database read-only and match it to the fused module."""
    return match(load_database(folder, hw), hw, fused_mod)


def replay_database(folder: str | Path, hw, fused_mod, require: bool = False,
                    loaded: Replay | None = None) -> Replay:
    """Open `folder` for `compile --db` and match it against the compile's fused module.

    Args:
        fused_mod: the module after the pipeline's front half, built with the database's
            weight_prepack setting (`database.db_weight_prepack`) and the compile's precision
            passes (they shape the fused functions).
        loaded: the database from `load_database`, when compile opened it already.

    Raises:
        TuningError: with `require`, any task the database does not serve (named).
    """
    replay = match(loaded or load_database(folder, hw), hw, fused_mod)
    if require and replay.misses:
        raise TuningError(
            f"--require-db: database {replay.folder} has no schedule for "
            f"{len(replay.misses)} of {len(replay.hits) + len(replay.misses)} tasks: "
            f"{', '.join(replay.misses)}",
            hint="tune them with `tvmopt tune MODEL --db DIR` using the same --shape")
    return replay
