"""Building `tvmopt-run` (runner.cc) for an architecture, cached by everything that shapes the
binary: the source, the compiler, the tvm-ffi headers' version and the architecture."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from ..errors import BuildError
from ..files import cache_root
from ..targets.cross import Toolchain
from .runtime import Runtime

SOURCE = Path(__file__).with_name("runner.cc")
NAME = "tvmopt-run"


def _compiler_id(cxx: str) -> str:
    proc = subprocess.run([cxx, "--version"], capture_output=True, text=True)
    return (proc.stdout.splitlines() or [cxx])[0]


def build_key(source: Path, tc: Toolchain, rt: Runtime) -> str:
    """What a cached binary built from `source` depends on: the source, the compiler, the TVM
    runtime versions it links and the architecture."""
    key = hashlib.sha256()
    key.update(source.read_bytes())
    key.update(source.with_name("run_time_checks.h").read_bytes())  # both binaries include it
    key.update(_compiler_id(tc.cxx).encode())
    key.update(repr(sorted(rt.versions.items())).encode())
    key.update(tc.arch.encode())
    return key.hexdigest()[:16]


def compile_command(tc: Toolchain, rt: Runtime, out: Path) -> list[str]:
    """The command line that builds the runner at `out`."""
    includes = [f"-I{d}" for d in rt.include_dirs]
    # libtvm_runtime.so is dlopen'ed after the hash check; only libtvm_ffi.so is linked, found
    # beside the bundle's bin/ through the rpath
    return [tc.cxx, "-std=c++17", "-O2", "-s", str(SOURCE), *includes,
            f"-L{rt.ffi_lib_dir}", "-ltvm_ffi", "-ldl", "-Wl,-rpath,$ORIGIN/../lib",
            "-Wl,--enable-new-dtags", "-o", str(out)]


def build_runner(tc: Toolchain, rt: Runtime, log=print) -> Path:
    """The runner binary for `tc.arch`, built once and cached.

    Raises:
        BuildError: the compiler failed (its first error line is quoted).
    """
    folder = cache_root() / "edge" / f"runner-{tc.arch}-{build_key(SOURCE, tc, rt)}"
    binary = folder / NAME
    if binary.exists():
        return binary
    folder.mkdir(parents=True, exist_ok=True)
    log(f"building {NAME} for {tc.arch} with {tc.cxx} (once; cached in {folder})")
    fd, tmp = tempfile.mkstemp(prefix=f".{NAME}.", dir=folder)
    os.close(fd)
    try:
        proc = subprocess.run(compile_command(tc, rt, Path(tmp)), capture_output=True, text=True)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if "error" in ln] or \
                proc.stderr.strip().splitlines() or ["no output"]
            raise BuildError(f"building {NAME} with {tc.cxx} failed: {lines[0]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, binary)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return binary
