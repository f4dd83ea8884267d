"""`compile --bundle`: one self-contained tarball that runs a model on a Linux board without Python.

    NAME/
      model/   model.so (the Relax VM library, weights bound in as constants), manifest.json
      lib/     libtvm_runtime.so, libtvm_ffi.so for the board's architecture
      bin/     tvmopt-run (C++; finds lib/ through an rpath of $ORIGIN/../lib)
      README.txt

The manifest is the artifact's own (compile's writer), plus a "bundle" section with the sha256 of
every file outside model/; tvmopt-run checks all of them before it loads the library.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildError
from ..files import sha256_file
from ..runtime.artifact import MANIFEST, Artifact, read_artifact
from ..targets.registry import HardwareTarget, get_target
from .runner import NAME as RUNNER, build_runner
from .runtime import runtime_for
from .toolchain import bundle_toolchain, emulation_command, missing_for_emulation, run_prefix

SUFFIXES = (".tar.gz", ".tgz")
_ELF_MACHINE = {0x3E: "x86_64", 0xB7: "aarch64"}


@dataclass
class Bundle:
    """A written bundle: the tarball, its size, and the folder name inside it."""

    path: Path
    size_bytes: int
    top: str
    files: dict[str, str]  # path inside the bundle -> sha256
    run_command: str  # how to run it from inside the unpacked folder
    verification: list | None = None  # runtime.verify.OutputError per output, when verified


def default_output(model: str) -> str:
    """MODEL.onnx -> MODEL-edge.tar.gz beside it."""
    p = Path(model)
    return str(p.with_name(p.stem + "-edge.tar.gz"))


def _top_name(out: Path) -> str:
    name = out.name
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)] or "bundle"
    raise BuildError(f"{out}: a bundle is a .tar.gz (or .tgz) file")


def elf_machine(path: Path) -> str | None:
    """The architecture of an ELF file, or None if it is not one."""
    with open(path, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    machine = int.from_bytes(head[18:20], "little")
    return _ELF_MACHINE.get(machine, f"machine {machine:#x}")


# GLIBCXX symbol version -> the first GCC whose libstdc++ provides it
_GCC_OF_GLIBCXX = {21: "5", 22: "6", 24: "7", 25: "8", 26: "9", 28: "10", 29: "11", 30: "12",
                   31: "13", 32: "14", 33: "15"}


def system_requirements(files: list[Path]) -> dict[str, str]:
    """The newest glibc and libstdc++ symbol versions the bundle's ELF files ask the board for
    (their version-need strings: GLIBC_2.N, GLIBCXX_3.4.N)."""
    glibc, glibcxx = (2, 17), 0
    for p in files:
        data = p.read_bytes()
        for m in re.finditer(rb"GLIBC_2\.(\d+)(?:\.\d+)?\x00", data):
            glibc = max(glibc, (2, int(m.group(1))))
        for m in re.finditer(rb"GLIBCXX_3\.4\.(\d+)\x00", data):
            glibcxx = max(glibcxx, int(m.group(1)))
    out = {"glibc": f"{glibc[0]}.{glibc[1]}"}
    if glibcxx:
        out["libstdc++"] = f"GLIBCXX_3.4.{glibcxx}"
        gcc = _GCC_OF_GLIBCXX.get(glibcxx)
        if gcc:
            out["gcc"] = gcc
    return out


def _readme(top: str, manifest: dict, emulate: str | None) -> str:
    ins = manifest["inputs"]
    outs = manifest["outputs"]

    def sig(t):
        shape = "x".join(str(d) for d in t["shape"]) if t["shape"] is not None else "any"
        return f"  {t['name']}: {t['dtype']}[{shape}]"

    flags = _input_flags(ins)
    t = manifest["target"]
    req = manifest["bundle"]["requires"]
    lines = [
        f"{top}: {manifest['model']['file']} compiled by tvmopt {manifest.get('tvmopt_version')} "
        f"for {t['name']} ({t['arch']}; {', '.join(t.get('features') or []) or 'baseline ISA'})",
        "",
        "Runs without Python: tvmopt-run loads model/model.so with the TVM runtime in lib/.",
        f"Needs a Linux board of that architecture with glibc >= {req['glibc']}"
        + (f" and the libstdc++ of GCC {req['gcc']} or newer" if req.get("gcc") else "") + ".",
        "",
        "Inputs (.npy files, C order, these dtypes and shapes):",
        *[sig(i) for i in ins],
        "Outputs (written as OUTPUT_DIR/NAME.npy):",
        *[sig(o) for o in outs],
        "",
        "On the board:",
        f"  scp {top}.tar.gz board:        # copy",
        f"  tar xzf {top}.tar.gz && cd {top}   # untar",
        f"  bin/{RUNNER} model/ {flags} --output-dir out --repeat 50 --json",
        "",
        "--json prints latency_ms {p50, p95, p99, min, max} over --repeat runs (after --warmup,",
        "default 1), load_ms (library load + VM initialization: the cold start), first_run_ms and",
        "peak_rss_kb. Every file is checked against the sha256 in model/manifest.json before the",
        "library is loaded; a changed file, a missing or unexpected input, or a wrong dtype or",
        "shape is a one-line error and exit status 1.",
    ]
    if emulate:
        lines += ["", "Without a board, under user-mode emulation on an x86-64 Linux machine",
                  "(figures measured this way are the emulator's, not the board's):",
                  f"  {emulate} bin/{RUNNER} model/ {flags} --output-dir out --json"]
    return "\n".join(lines) + "\n"


def _input_flags(inputs: list[dict]) -> str:
    return " ".join(f"--input {t['name']}={_file_name(t['name'])}.npy" for t in inputs)


def _file_name(name: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return "_" + out if not out or out.startswith(".") else out


def write_bundle(artifact: str | Path, out: str | Path, log=print, verify_model: str | None = None,
                 tolerance=None, dims: dict[str, int] | None = None) -> Bundle:
    """Pack a CPU artifact with the runtime and runner for its architecture.

    Args:
        artifact: the artifact folder (becomes model/).
        out: the .tar.gz to write (atomically).
        verify_model: run the packed bundle's runner (natively or under qemu-user) on random
            inputs and compare with onnxruntime on this .onnx before writing; a failure writes
            no bundle.
        tolerance, dims: verification tolerance and symbolic dim values.

    Raises:
        BuildError: not a CPU artifact, the library is not built for the target's architecture,
            a toolchain or runtime wheel is missing, or the output name is not .tar.gz.
        VerificationError: verification failed.
    """
    art: Artifact = read_artifact(artifact)
    out = Path(out)
    top = _top_name(out)
    hw: HardwareTarget = get_target(art.manifest["target"]["name"])
    tc = bundle_toolchain(hw)
    arch = hw.arch
    got = elf_machine(art.library)
    if got != arch:
        raise BuildError(f"{art.library}: built for {got or 'no ELF architecture'}, the target "
                         f"'{hw.name}' is {arch}; recompile for it")
    rt = runtime_for(arch, log)
    runner = build_runner(tc, rt, log)

    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{top}.", dir=out.parent))
    try:
        root = stage / top
        shutil.copytree(art.path, root / "model")
        (root / "lib").mkdir()
        for name, src in rt.lib_paths.items():
            shutil.copy2(src, root / "lib" / name)
        (root / "bin").mkdir()
        shutil.copy2(runner, root / "bin" / RUNNER)
        os.chmod(root / "bin" / RUNNER, 0o755)
        manifest = dict(art.manifest)
        manifest["tvm_ffi_version"] = rt.versions.get("apache-tvm-ffi")
        manifest["bundle"] = {
            "runner": f"bin/{RUNNER}",
            "arch": arch,
            "requires": system_requirements([p for p in root.rglob("*") if p.is_file()
                                             and elf_machine(p)]),
            "runtime": rt.to_json(),
            "compiler": tc.cxx,
            "params": "bound into model.so as constants at compile time",
        }
        (root / "README.txt").write_text(_readme(top, manifest, emulation_command(arch)))
        files = {p.relative_to(root).as_posix(): sha256_file(p)
                 for p in sorted(root.rglob("*")) if p.is_file() and p.parts[len(root.parts)] != "model"}
        _refuse_python(root)
        # paths relative to the bundle root (the model folder's parent)
        manifest["bundle"]["files"] = files
        (root / "model" / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        errors = None
        if verify_model:
            from ..runtime.verify import Tolerance, check
            from .verify import verify_bundle

            tol = tolerance or Tolerance()
            log(f"verifying the bundle: {RUNNER} on random inputs vs onnxruntime")
            errors, manifest["verification"] = verify_bundle(root, verify_model, tol, dims)
            (root / "model" / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            check(errors, tol)
        tmp_tar = stage / out.name
        with tarfile.open(tmp_tar, "w:gz") as tar:
            tar.add(root, arcname=top, filter=_normalize)
        os.replace(tmp_tar, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    all_files = {**{f"model/{k}": v for k, v in manifest["files"].items()}, **files}
    run = f"bin/{RUNNER} model/ {_input_flags(manifest['inputs'])} --output-dir out --json"
    return Bundle(out, out.stat().st_size, top, all_files, run, errors)


def _normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # a bundle unpacks the same for whoever builds it
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.isdir() or info.mode & 0o100 else 0o644
    return info


def _refuse_python(root: Path) -> None:
    bad = [p.relative_to(root).as_posix() for p in root.rglob("*")
           if p.suffix in (".py", ".pyc") or "libpython" in p.name]
    if bad:
        raise BuildError(f"bundle would hold Python files ({', '.join(bad)}); it must run "
                         "without Python")


def compile_bundle(opts, out: str | Path | None = None, log=print):
    """Compile `opts.model` for `opts.target` and pack the bundle at `out`.

    Args:
        opts: a build.compile.CompileOptions; its `output` is ignored (the artifact is the
            bundle's model/ folder); `verify` runs the bundle itself (see write_bundle).
        out: the .tar.gz to write (default MODEL-edge.tar.gz beside the model).

    Returns:
        (CompileResult, Bundle).

    Raises:
        TvmoptError: any compile failure; BuildError for a missing toolchain, before compiling.
    """
    from ..interface.compile import compile_model

    out = Path(out or default_output(opts.model))
    _top_name(out)
    hw = get_target(opts.target)
    bundle_toolchain(hw)  # a missing package fails now, not after the build
    verify, opts.verify = opts.verify, False  # the bundle is verified, not the host artifact
    if opts.dispatch != "codegen":
        # The runner loads the model with the TVM runtime alone: a oneDNN call (which a
        # symbolic-shape dense layer gets too) would find no extension on the board.
        log("note: a bundle runs without Python or the oneDNN extension: every kernel is a "
            "default schedule (--dispatch codegen)")
        opts.dispatch = "codegen"
    if verify and run_prefix(hw.arch) is None:
        raise BuildError(f"--verify runs the {hw.arch} bundle here; this host "
                         f"{missing_for_emulation(hw.arch)}")
    work = Path(tempfile.mkdtemp(prefix=".tvmopt-bundle.", dir=out.parent if out.parent.exists()
                                 else None))
    try:
        opts.output = str(work / "model")
        result = compile_model(opts, log=log)
        bundle = write_bundle(result.artifact.path, out, log=log,
                              verify_model=opts.model if verify else None,
                              tolerance=opts.tolerance, dims=opts.verify_dims)
        result.verification = bundle.verification
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result, bundle
