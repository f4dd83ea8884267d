"""The oneDNN extension: build `onednn_ext.cc` (next to this file) into a tvm-ffi library and
load it, which registers the global functions the lowered modules call (`tvmopt.onednn.conv2d`,
`matmul`, `batch_matmul`, `attention`, `qconv2d`, `qmatmul`, `rnn`). The Relax VM resolves
`R.call_dps_packed` names in the global registry when it runs, so the library must be loaded in
the process first (also before running an exported module that calls it).

The calling convention (argument order and the int64 attrs vector) is shared with
`onednn_ext.cc`: change both together. `R.call_dps_packed` passes the listed arguments and then
the output tensor, so the attrs `R.shape` sits just before the output.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import re
import sys
from pathlib import Path

import tvm
import tvm_ffi

from ...files import cache_root


CONV_FUNC = "tvmopt.onednn.conv2d"
MATMUL_FUNC = "tvmopt.onednn.matmul"
QCONV_FUNC = "tvmopt.onednn.qconv2d"
QMATMUL_FUNC = "tvmopt.onednn.qmatmul"
BMM_FUNC = "tvmopt.onednn.batch_matmul"
ATTN_FUNC = "tvmopt.onednn.attention"
# attention's layout attr: a bit per tensor given (batch, seq, heads, d), not (batch, heads, ...)
ATTN_SEQ_MAJOR_Q, ATTN_SEQ_MAJOR_K, ATTN_SEQ_MAJOR_V, ATTN_SEQ_MAJOR_OUT = 1, 2, 4, 8
_PREFIX = "tvmopt_onednn."
_SOURCE = Path(__file__).with_name("onednn_ext.cc")  # shipped inside the package

# Activation codes understood by onednn_ext.cc.
ACT_NONE, ACT_RELU, ACT_CLIP, ACT_GELU_ERF, ACT_GELU_TANH, ACT_SWISH = 0, 1, 2, 3, 4, 5
# Conv layout modes: let oneDNN pick blocked activation layouts (reordered around each call),
# or pin activations to NCHW.
LAYOUT_AUTO, LAYOUT_PLAIN = 0, 1
# Compute precisions understood by onednn_ext.cc (the last attrs entry of both calls): bf16
# converts activations and weights to bf16 inside the call, accumulates and returns fp32.
COMPUTE = {"fp32": 0, "bf16": 1}
# Module attribute holding the int8 weights of a QDQ model: [[int8 tensor, fp32 scales, axis]].
QDQ_WEIGHTS_ATTR = "tvmopt.qdq_weights"
# CPU flags (/proc/cpuinfo names) of int8 dot-product units. Without one oneDNN still runs u8s8
# kernels, but on vpmaddubsw, whose int16 intermediate sums saturate: wrong results, and slow.
INT8_FEATURES = ("amx_int8", "avx512_vnni", "avx_vnni")

_loaded: dict[str, object] = {}


def find_onednn(root: str | None = None) -> tuple[Path, Path]:
    """Return (include_dir, lib_dir) of a oneDNN install with dnnl.hpp and libdnnl.so.

    PyPI's ``onednn-devel-cpu-gomp`` wheels put their files under the install prefix's
    ``include/`` and ``lib/`` (``pip install --prefix DIR`` or a venv), not in site-packages.
    """
    candidates = []
    for r in (root, os.environ.get("TVMOPT_ONEDNN_ROOT"), sys.prefix, sys.base_prefix,
              "/usr/local", "/usr"):
        if r:
            candidates.append(Path(r))
    for r in candidates:
        inc = r / "include"
        for lib in (r / "lib", r / "lib64", r / "lib" / "x86_64-linux-gnu"):
            if (inc / "dnnl.hpp").exists() and glob.glob(str(lib / "libdnnl.so*")):
                return inc, lib
    raise FileNotFoundError(
        "oneDNN not found (need include/dnnl.hpp and lib/libdnnl.so); install "
        "onednn-cpu-gomp + onednn-devel-cpu-gomp or set TVMOPT_ONEDNN_ROOT. Searched: "
        + ", ".join(str(c) for c in candidates)
    )


def _dnnl_header(inc: Path, name: str) -> str:
    # The top-level headers are shims that include oneapi/dnnl/<name>.
    real = inc / "oneapi" / "dnnl" / name
    return (real if real.exists() else inc / name).read_text()


def _onednn_version(inc: Path) -> str:
    text = _dnnl_header(inc, "dnnl_version.h")
    parts = [re.search(rf"#define DNNL_VERSION_{k}\s+(\S+)", text) for k in
             ("MAJOR", "MINOR", "PATCH", "HASH")]
    return ".".join(m.group(1).strip('"') for m in parts if m)


def _threading_runtime(inc: Path) -> str:
    text = _dnnl_header(inc, "dnnl_config.h")
    m = re.search(r"#define DNNL_CPU_THREADING_RUNTIME\s+DNNL_RUNTIME_(\w+)", text)
    return m.group(1) if m else "UNKNOWN"


def build_extension(cache_dir: str | os.PathLike, onednn_root: str | None = None) -> str:
    """Compile the extension once per (source, oneDNN, tvm-ffi, flags); return the .so path.

    Raises FileNotFoundError when oneDNN is missing and RuntimeError when compiling fails.
    """
    inc, lib = find_onednn(onednn_root)
    threading = _threading_runtime(inc)
    if threading not in ("OMP", "SEQ"):
        # TBB/SYCL builds need Intel runtimes that the PyPI wheels pull in separately
        # (a SYCL build needs the DPC++ runtime); the thread control below assumes OpenMP.
        raise RuntimeError(f"oneDNN at {inc.parent} uses {threading} threading; need OMP")
    cflags = ["-O3", "-DNDEBUG", "-fopenmp"]
    ldflags = [f"-L{lib}", "-ldnnl", f"-Wl,-rpath,{lib}", "-fopenmp", "-ldl"]
    key = "\n".join([
        _SOURCE.read_text(), _onednn_version(inc), str(lib), tvm_ffi.__version__,
        " ".join(cflags + ldflags),
    ])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    build_dir = Path(cache_dir) / f"tvmopt_onednn_{digest}"
    out = build_dir / "tvmopt_onednn.so"
    build_dir.mkdir(parents=True, exist_ok=True)
    # Processes loading the extension at once (bench workers, parallel compiles or test
    # workers) would otherwise build into one folder together, or load a library another is
    # still linking: one builds, the others wait and load what it wrote.
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return str(out)
        return tvm_ffi.cpp.build(
            name="tvmopt_onednn",
            sources=[str(_SOURCE)],
            extra_cflags=cflags,
            extra_ldflags=ldflags,
            extra_include_paths=[str(inc)],
            build_directory=str(build_dir),
        )


def load_extension(cache_dir: str | os.PathLike | None = None, num_threads: int | None = None):
    """Build if needed and load the extension, registering the ``tvmopt.onednn.*`` globals.

    ``num_threads`` overrides TVM_NUM_THREADS for oneDNN's OpenMP pool; None keeps the
    environment's choice (TVM_NUM_THREADS, else OpenMP's default).
    """
    if cache_dir is None and _loaded and num_threads is None:
        return next(iter(_loaded.values()))  # one extension per process is enough
    if cache_dir is None:
        cache_dir = cache_root()
    path = build_extension(cache_dir)
    # libgomp's default wait policy (spin briefly, then sleep) is kept: a model's kernels all
    # run on this one OpenMP team (share_pool), and waking sleeping workers for each of them
    # (OMP_WAIT_POLICY=PASSIVE) would add a wake-up to every kernel call.
    if path not in _loaded:
        # Keep the module object alive: the registered globals point into the library.
        _loaded[path] = tvm_ffi.load_module(path)
    if num_threads is not None:
        tvm_ffi.get_global_func("tvmopt.onednn.set_num_threads")(int(num_threads))
    return _loaded[path]


def share_pool(library_path: str) -> bool:
    """Run a loaded TVM library's parallel loops on oneDNN's OpenMP team (one pool per model:
    two pools on the same cores slow each other down at every hand-over). False when the
    library keeps TVM's pool; it is then correct, only slower beside oneDNN."""
    f = tvm_ffi.get_global_func("tvmopt.onednn.share_pool", allow_missing=True)
    return bool(f(str(library_path))) if f is not None else False


def load_library(library_path: str):
    """Load a compiled library that calls oneDNN kernels, its TVM kernels on oneDNN's team:
    how an artifact runs, and so how the dispatch timing must run the library side too."""

    lib = tvm.runtime.load_module(str(library_path))
    share_pool(library_path)
    return lib


def extension_id() -> str:
    """Identity of the extension's source, for caches of what it measured."""
    return hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:16]
