"""The database folder: MetaSchedule's two JSON files plus tvmopt's manifest, sanitized on
load, locked while tuned, checked against the target, pruned for committing.

    DIR/database_workload.json        one workload (fused PrimFunc) per line
    DIR/database_tuning_record.json   one measured schedule per line, appended as measured
    DIR/tvmopt-db.json                target (name + TVM target), TVM version, model sha256,
                                      input shapes, trials
    DIR/.lock                         fcntl lock held by a running `tvmopt tune`
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import TargetError, TuningError

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
MANIFEST_FILE = "tvmopt-db.json"
LOCK_FILE = ".lock"
# A failed measurement is stored with this run time by MetaSchedule.
_FAILED_SECS = 1e9


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


# What a line that does not load raises: JSON that does not parse (ValueError), a value of the
# wrong shape or type (ValueError, TypeError, KeyError, IndexError, unpacking and indexing it),
# and TVM's from_json refusing it (an ICHECK: InternalError, a RuntimeError; or TypeError).
# Such a line is dropped and counted in the SanitizeReport.
_UNLOADABLE = (ValueError, TypeError, KeyError, IndexError, RuntimeError)


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
        except _UNLOADABLE:
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
        except _UNLOADABLE:
            rep.bad_record_lines += 1
            continue
        kept_rec.append(json.dumps([new_idx, rec]))
    dst.mkdir(parents=True, exist_ok=True)
    atomic_write(dst / WORKLOAD_FILE, "".join(ln + "\n" for ln in kept_wl))
    atomic_write(dst / RECORD_FILE, "".join(ln + "\n" for ln in kept_rec))
    rep.workloads, rep.records = len(kept_wl), len(kept_rec)
    return rep


def atomic_write(path: Path, text: str) -> None:
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


def db_weight_prepack(folder: str | Path) -> bool:
    """Whether the database in `folder` was tuned with CPU weight prepack (its manifest says)."""
    return bool((read_manifest(Path(folder)) or {}).get("weight_prepack"))


def db_dispatch(folder: str | Path) -> str:
    """The --dispatch the database was tuned under ("codegen" for databases from before tune
    had the option: every kernel was a task)."""
    return str((read_manifest(Path(folder)) or {}).get("dispatch") or "codegen")


def recorded_library_choices(manifest: dict | None, dispatch: str | None,
                             any_precision: bool = False) -> dict | None:
    """{workload key: compute precision} of the library calls a database was tuned with, or
    None where it did not record them under this `dispatch` ("auto" only: the other modes
    decide nothing by timing). Which kernels go to the library, and in which precision, is
    timed; a build that times one differently (another host, or noise near a tie) has other
    tasks than the database: a convolution on oneDNN there is a task here, and the casts around
    a bf16 call fuse into the kernels beside it. `any_precision`: also a manifest from before
    the precisions were recorded (every call then fp32)."""
    manifest = manifest or {}
    if dispatch != "auto" or manifest.get("dispatch") != "auto" \
            or "library_kernels" not in manifest:
        return None
    if "library_precisions" not in manifest and not any_precision:
        return None
    precisions = manifest.get("library_precisions") or {}
    return {k: precisions.get(k, "fp32") for k in manifest["library_kernels"]}


def check_target(folder: Path, manifest: dict | None, hw) -> None:
    """Refuse a database tuned for another target (MetaSchedule would not notice).

    Raises:
        TargetError: the manifest names another target, or the same name with another TVM target.
    """
    if manifest is None:
        return
    tgt = manifest.get("target", {})
    if tgt.get("name") != hw.name or tgt.get("tvm_dict", hw.tvm) != json_roundtrip(hw.tvm):
        raise TargetError(
            f"database {folder} was tuned for target '{tgt.get('name')}' "
            f"({tgt.get('tvm_dict')}), not '{hw.name}' ({hw.tvm})",
            hint="tune for this target with `tvmopt tune MODEL --target "
                 f"{hw.name} --db NEW_DIR`")


def check_tvm_version(folder: Path, manifest: dict | None) -> None:
    """Refuse a database tuned with another TVM release: its traces replay another version's
    schedule primitives, which may not apply or may mean something else.

    Raises:
        TuningError: naming both versions.
    """
    import tvm

    theirs = (manifest or {}).get("tvm_version")
    if theirs is None or _release(theirs) == _release(tvm.__version__):
        return
    raise TuningError(f"database {folder} was tuned with TVM {theirs}, this is TVM "
                      f"{tvm.__version__}: its schedules may not apply or may mean something "
                      "else", hint="tune again with `tvmopt tune MODEL --db NEW_DIR`")


def _release(version: str) -> str:
    """'0.27.0.post1' -> '0.27.0': a post release repackages the same TVM."""
    import re

    m = re.match(r"\d+(\.\d+)*", version.strip())
    return m.group(0) if m else version


# What makes records of one target unusable for another (num-cores, say, does not).
_TARGET_KEYS = ("mtriple", "mcpu", "mattr", "arch")


def _target_key(target) -> tuple:
    return (target.kind.name,) + tuple(str(target.attrs.get(k)) for k in _TARGET_KEYS)


def check_record_targets(folder: Path, records, target) -> None:
    """Refuse a database holding records measured for another target than `target`, whatever
    its manifest says (MetaSchedule looks records up by workload alone).

    Raises:
        TargetError: naming how many records and which target they were measured for.
    """
    want = _target_key(target)
    other = [r for r in records if r.target is not None and _target_key(r.target) != want]
    if other:
        theirs = other[0].target
        raise TargetError(
            f"database {folder} holds {len(other)} of {len(records)} records measured for "
            f"{theirs.kind.name} {dict((k, str(theirs.attrs.get(k))) for k in _TARGET_KEYS if theirs.attrs.get(k) is not None)}, "
            f"not this compile's {target.kind.name} "
            f"{dict((k, str(target.attrs.get(k))) for k in _TARGET_KEYS if target.attrs.get(k) is not None)}",
            hint="tune for this target with `tvmopt tune MODEL --db NEW_DIR`")


def json_roundtrip(obj):
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


def valid_secs(rec) -> float | None:
    if rec.run_secs is None or len(rec.run_secs) == 0:
        return None
    secs = [float(s) for s in rec.run_secs]
    mean = sum(secs) / len(secs)
    return None if mean >= _FAILED_SECS else mean


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
                valid = sorted((r for r in recs if valid_secs(r) is not None), key=valid_secs)
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
            atomic_write(folder / MANIFEST_FILE, json.dumps(m, indent=2) + "\n")
    return before, after


def _workload_hash(workload) -> int:
    import tvm_ffi

    return tvm_ffi.structural_hash(workload.mod)


def bundled_db_dir(model_name: str, target_name: str) -> Path:
    """Where the committed database of a bundled model lives."""
    from .._data import data_dir

    return data_dir("schedules") / model_name / target_name
