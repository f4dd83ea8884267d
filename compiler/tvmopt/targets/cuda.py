"""Building CUDA artifacts on machines without a GPU.

What TVM 0.27 (PyPI wheel) does: its CUDA codegen emits CUDA C and hands it to the Python
callback `tvm_callback_cuda_compile` (tvm/support/nvcc.py), which compiles with NVRTC by default
(needs the `cuda-bindings` package) or with nvcc when TVM_CUDA_COMPILE_MODE=nvcc (a fatbin). But
that path is only taken when `libtvm_runtime_cuda.so` loads, and it links the driver library
`libcuda.so.1`, which a GPU-less machine does not have. Without it TVM silently falls back to a
module that holds only the CUDA source (no binary), which no GPU can load.

So for a build here we (1) use nvcc (installed; cuda-bindings is not), and (2) satisfy the
runtime library's link to libcuda.so.1 with a stub whose every entry point returns
CUDA_ERROR_NO_DEVICE, the same thing NVIDIA's toolkit ships as lib64/stubs/libcuda.so for linking
on build machines. On a machine with a real driver nothing is stubbed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import BuildError

# The driver entry points libtvm_runtime_cuda.so imports (nm -D --undefined-only, TVM 0.27.0).
_DRIVER_SYMBOLS = ("cuDeviceGetName", "cuFuncSetAttribute", "cuGetErrorName", "cuGetErrorString",
                   "cuLaunchKernelEx", "cuModuleGetFunction", "cuModuleLoadData", "cuModuleUnload",
                   "cuTensorMapEncodeTiled")
_ready = False


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tvmopt"


def _stub_driver() -> Path:
    """Build (once) the stand-in libcuda.so.1 for build-only machines."""
    out = _cache_dir() / "stub-libcuda" / "libcuda.so.1"
    if out.exists():
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise BuildError("building CUDA artifacts without a GPU driver needs a C compiler (cc) "
                         "for the libcuda stub")
    out.parent.mkdir(parents=True, exist_ok=True)
    src = "".join(f"int {s}(void) {{ return 100; /* CUDA_ERROR_NO_DEVICE */ }}\n"
                  for s in _DRIVER_SYMBOLS)
    with tempfile.TemporaryDirectory() as tmp:
        c = Path(tmp) / "stub.c"
        c.write_text(src)
        lib = Path(tmp) / "libcuda.so.1"
        r = subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib),
                            str(c)], capture_output=True, text=True)
        if r.returncode:
            raise BuildError(f"cannot build the libcuda stub: {r.stderr.strip()[-200:]}")
        os.replace(lib, out)
    return out


def has_cuda_driver() -> bool:
    return ctypes.util.find_library("cuda") is not None or _can_dlopen("libcuda.so.1")


def _can_dlopen(name: str) -> bool:
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


def _set_cuda_home() -> None:
    """TVM looks for CUDA headers beside nvcc (../include); a wrapper script in /usr/local/bin
    sends it to /usr/local/include. Point CUDA_PATH (what tvm.support.nvcc reads) at a toolkit
    that has the headers."""
    if os.environ.get("CUDA_PATH"):
        return
    nvcc = shutil.which("nvcc")
    candidates = [Path(os.path.realpath(nvcc)).parent.parent] if nvcc else []
    candidates += [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)]
    for root in candidates:
        if (root / "include" / "cuda_runtime.h").exists():
            os.environ["CUDA_PATH"] = str(root)
            return


def enable_cuda_codegen() -> None:
    """Make TVM compile CUDA kernels to a binary (fatbin) in this process.

    Raises:
        BuildError: nvcc is missing, or TVM's CUDA runtime library cannot be loaded.
    """
    global _ready
    if _ready:
        return
    import tvm  # noqa: F401
    import tvm_ffi

    if shutil.which("nvcc") is None and not _has_nvrtc():
        raise BuildError("CUDA targets need nvcc on PATH (or the cuda-bindings package for NVRTC)")
    if not _has_nvrtc():
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    _set_cuda_home()
    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        if not has_cuda_driver():
            ctypes.CDLL(str(_stub_driver()), mode=ctypes.RTLD_GLOBAL)
        from tvm.backend import cuda as tvm_cuda
        from tvm_ffi.libinfo import load_lib_ctypes

        runtime_dir = Path(tvm_cuda._LOADED_LIBS["tvm_runtime"]._name).resolve().parent
        try:
            tvm_cuda._LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
                package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[runtime_dir],
                mode="RTLD_LOCAL")
        except (OSError, RuntimeError) as err:
            raise BuildError(f"cannot load TVM's CUDA runtime library: {err}") from None
    _ready = True


def _has_nvrtc() -> bool:
    try:
        import cuda.bindings.nvrtc  # noqa: F401
    except ImportError:
        return False
    return True


def cuda_source(executable) -> str:
    """The generated CUDA C of a built executable ('' when it has no CUDA module)."""
    found = []

    def walk(m):
        if m.kind == "cuda":
            found.append(m.inspect_source("cuda"))
        for i in m.imports:
            walk(i)

    walk(executable.mod)
    return "\n".join(found)


def ptx_of(source: str, arch: str) -> str:
    """Compile CUDA C to PTX with nvcc (to inspect which instructions the kernels use)."""
    with tempfile.TemporaryDirectory() as tmp:
        cu, ptx = Path(tmp) / "k.cu", Path(tmp) / "k.ptx"
        cu.write_text(source)
        r = subprocess.run(["nvcc", "--ptx", f"-arch={arch}", "-o", str(ptx), str(cu)],
                           capture_output=True, text=True)
        if r.returncode:
            raise BuildError(f"nvcc --ptx failed: {r.stderr.strip()[-300:]}")
        return ptx.read_text()


def tensor_core_kernels(source: str) -> tuple[list[str], list[str]]:
    """(kernels whose body uses tensor-core MMA, all kernels) in generated CUDA C."""
    names, with_tc = [], []
    chunks = re.split(r"(?=extern \"C\" __global__|__global__ void)", source)
    for chunk in chunks:
        m = re.search(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)", chunk)
        if not m:
            continue
        names.append(m.group(1))
        if "mma_sync" in chunk or "mma.sync" in chunk or "wgmma" in chunk:
            with_tc.append(m.group(1))
    return with_tc, names
