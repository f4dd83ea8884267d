"""Artifacts: a folder holding the compiled library and a manifest.json describing it.

manifest.json records versions, the full target, input/output signatures, the model's sha256,
the passes and precision applied, the tuning database used, and a sha256 of every other file.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import ArtifactError
from ..files import sha256_file
from ..tensor_info import TensorInfo

MANIFEST = "manifest.json"
LIBRARY = "model.so"
FORMAT_VERSION = 1


@dataclass
class Artifact:
    """An artifact folder and its parsed manifest."""

    path: Path
    manifest: dict[str, Any]

    @property
    def inputs(self) -> list[TensorInfo]:
        return [TensorInfo.from_json(d) for d in self.manifest["inputs"]]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [TensorInfo.from_json(d) for d in self.manifest["outputs"]]

    @property
    def library(self) -> Path:
        return self.path / self.manifest.get("library", LIBRARY)


def write_artifact(out_dir: str | Path, executable, manifest: dict[str, Any],
                   extra_files: dict[str, bytes] | None = None, cc: str | None = None) -> Artifact:
    """Export the executable and write the manifest, atomically replacing `out_dir`.

    The folder is assembled beside the destination and renamed into place, so an interrupted
    compile never leaves a half-written artifact over a good one.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        kwargs = {"cc": cc} if cc else {}
        executable.export_library(str(tmp / LIBRARY), **kwargs)
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        manifest = {
            "format": FORMAT_VERSION,
            "tvmopt_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "built_on": {"machine": platform.machine(), "python": platform.python_version()},
            **manifest,
            "library": LIBRARY,
            "files": files,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
        if out.exists():
            if not (out / MANIFEST).exists() and any(out.iterdir()):
                raise ArtifactError(f"{out}: exists and is not a tvmopt artifact; refusing to overwrite")
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Artifact(out, manifest)


def read_artifact(path: str | Path, check_hashes: bool = True) -> Artifact:
    """Read an artifact's manifest and check every file against its recorded sha256.

    Raises:
        ArtifactError: missing folder/manifest, unreadable manifest, missing or modified files.
    """
    p = Path(path)
    if not p.exists():
        raise ArtifactError(f"{p}: no such artifact")
    if p.is_file():
        raise ArtifactError(f"{p}: is a file; an artifact is the folder written by 'tvmopt compile'")
    mf = p / MANIFEST
    if not mf.exists():
        raise ArtifactError(f"{p}: no {MANIFEST}; not a tvmopt artifact")
    try:
        manifest = json.loads(mf.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{mf}: unreadable manifest: {err}") from None
    for key in ("format", "files", "inputs", "outputs", "target"):
        if key not in manifest:
            raise ArtifactError(f"{mf}: manifest lacks '{key}'")
    if manifest["format"] != FORMAT_VERSION:
        raise ArtifactError(f"{mf}: manifest format {manifest['format']}, this tvmopt reads "
                            f"{FORMAT_VERSION}; recompile the model")
    # the manifest names the files to hash and the library to load: both must be plain names
    # inside the folder, or an edited manifest could load a library it never hashed
    files = manifest["files"]
    if not isinstance(files, dict):
        raise ArtifactError(f"{mf}: 'files' is not a map of file names to sha256")
    for name in [*files, manifest.get("library", LIBRARY)]:
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise ArtifactError(f"{mf}: file name {name!r} is not a plain name inside the artifact")
    if manifest.get("library", LIBRARY) not in files:
        raise ArtifactError(f"{mf}: the library {manifest.get('library', LIBRARY)!r} has no sha256 "
                            "in the manifest; refusing to load unverified code")
    if check_hashes:
        for name, digest in manifest["files"].items():
            fp = p / name
            if not fp.exists():
                raise ArtifactError(f"{p}: file '{name}' listed in the manifest is missing")
            if sha256_file(fp) != digest:
                raise ArtifactError(f"{p}: file '{name}' does not match its sha256 in the manifest "
                                    "(modified or corrupted); recompile the model")
    return Artifact(p, manifest)


def update_manifest(artifact: Artifact, **fields: Any) -> None:
    """Add fields to the manifest (e.g. verification results); file hashes stay as they are."""
    artifact.manifest.update(fields)
    path = artifact.path / MANIFEST
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(artifact.manifest, indent=2) + "\n")
    os.replace(tmp, path)
