"""The TVM runtime a bundle carries: libtvm_runtime.so and libtvm_ffi.so for the bundle's
architecture, plus the tvm-ffi headers the runner is compiled against.

For this host's architecture they come from the installed apache-tvm / apache-tvm-ffi wheels. For
a foreign one, from the same versions' manylinux wheels on PyPI (runtime_wheels.toml), downloaded
once with pip into the cache, checked against PyPI's sha256, and unpacked there.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..errors import BuildError, last_line
from ..files import cache_root, sha256_file
from ..targets.registry import host_arch

LIBS = ("libtvm_runtime.so", "libtvm_ffi.so")
_WHEELS = Path(__file__).with_name("runtime_wheels.toml")


@dataclass
class Runtime:
    """Runtime libraries and runner headers for one architecture."""

    arch: str
    lib_paths: dict[str, Path]  # LIBS name -> file
    include_dirs: list[Path]
    versions: dict[str, str]  # project -> version
    source: str  # "installed" or "pypi"
    wheels: list[dict] = field(default_factory=list)  # {file, sha256} when from PyPI

    @property
    def ffi_lib_dir(self) -> Path:
        """The folder the runner links libtvm_ffi.so from."""
        return self.lib_paths["libtvm_ffi.so"].parent

    def to_json(self) -> dict:
        return {"arch": self.arch, "source": self.source, "versions": self.versions,
                "wheels": self.wheels}


def installed_versions() -> dict[str, str]:
    """The apache-tvm / apache-tvm-ffi versions this tvmopt compiles with."""
    out = {}
    for project in ("apache-tvm", "apache-tvm-ffi"):
        try:
            out[project] = version(project)
        except PackageNotFoundError:
            raise BuildError(f"{project} is not installed; reinstall tvmopt") from None
    return out


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # without importing TVM
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(f"the '{name}' Python package is not installed; reinstall tvmopt")
    return Path(next(iter(spec.submodule_search_locations)))


def _installed_runtime(arch: str) -> Runtime:
    tvm_dir, ffi_dir = _package_dir("tvm"), _package_dir("tvm_ffi")
    found = {"libtvm_runtime.so": tvm_dir / "lib" / "libtvm_runtime.so",
             "libtvm_ffi.so": ffi_dir / "lib" / "libtvm_ffi.so"}
    for name, path in found.items():
        if not path.exists():
            raise BuildError(f"{path}: missing from the installed wheel; reinstall apache-tvm "
                             "and apache-tvm-ffi")
    return Runtime(arch, found, [ffi_dir / "include"], installed_versions(), "installed")


def wheel_specs(arch: str) -> tuple[str, list[dict]]:
    """(pip platform tag, wheels) for `arch` from runtime_wheels.toml."""
    data = tomllib.loads(_WHEELS.read_text())
    if arch not in data:
        raise BuildError(f"no TVM runtime wheels known for {arch} (known: {', '.join(data)})")
    return data[arch]["platform"], data[arch]["wheel"]


def _download(spec: dict, platform_tag: str, dest: Path, log) -> Path:
    """The wheel `spec` in `dest`, fetched with pip if absent; its sha256 checked either way."""
    path = dest / spec["file"]
    if not path.exists():
        dest.mkdir(parents=True, exist_ok=True)
        log(f"downloading {spec['file']} (once; cached in {dest})")
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--platform", platform_tag, "--python-version", "3.11",
               "--implementation", "cp", "--abi", "cp311", "--dest", str(dest),
               f"{spec['project']}=={spec['version']}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not path.exists():
            last = last_line(proc.stderr, "pip gave no reason")
            raise BuildError(f"cannot download {spec['file']} from PyPI ({last}); on a machine "
                             f"without network, put that file into {dest}")
    digest = sha256_file(path)
    if digest != spec["sha256"]:
        path.unlink()
        raise BuildError(f"{path}: sha256 {digest[:16]}... differs from PyPI's "
                         f"{spec['sha256'][:16]}...; removed it, run again to download it anew")
    return path


def _pypi_runtime(arch: str, log) -> Runtime:
    platform_tag, specs = wheel_specs(arch)
    have = installed_versions()
    for s in specs:
        if have.get(s["project"]) != s["version"]:
            raise BuildError(f"this tvmopt compiles with {s['project']} {have.get(s['project'])}, "
                             f"but the {arch} runtime it bundles is {s['version']} "
                             f"(tvmopt/edge/runtime_wheels.toml); install {s['project']}=="
                             f"{s['version']}")
    root = cache_root() / "edge"
    out = root / ("runtime-" + "-".join([arch] + [s["version"] for s in specs]))
    lib_dir, inc_dir = out / "lib", out / "include"
    stamp = out / "sha256.txt"
    want = "\n".join(f"{s['sha256']}  {s['file']}" for s in specs) + "\n"
    if not (stamp.exists() and stamp.read_text() == want and
            all((lib_dir / n).exists() for n in LIBS)):
        shutil.rmtree(out, ignore_errors=True)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "lib").mkdir(parents=True)
        for s in specs:
            wheel = _download(s, platform_tag, root / "wheels", log)
            with zipfile.ZipFile(wheel) as z:
                for member in s.get("libs", []):
                    (tmp / "lib" / Path(member).name).write_bytes(z.read(member))
                prefix = s.get("include")
                if prefix:
                    for info in z.infolist():
                        if info.filename.startswith(prefix + "/") and not info.is_dir():
                            dst = tmp / "include" / info.filename[len(prefix) + 1:]
                            dst.parent.mkdir(parents=True, exist_ok=True)
                            dst.write_bytes(z.read(info))
        (tmp / "sha256.txt").write_text(want)
        os.replace(tmp, out)
    return Runtime(arch, {n: lib_dir / n for n in LIBS}, [inc_dir], {s["project"]: s["version"] for s in specs}, "pypi",
                   [{"file": s["file"], "sha256": s["sha256"]} for s in specs])


def runtime_for(arch: str, log=print) -> Runtime:
    """The runtime libraries and headers for `arch` (downloaded and cached when foreign).

    Raises:
        BuildError: unknown arch, version mismatch, download failure or a wheel whose sha256
            differs from PyPI's.
    """
    if arch == host_arch():
        return _installed_runtime(arch)
    return _pypi_runtime(arch, log)
