"""Measuring candidates on a 2-core machine: the target's tensor intrinsics only, a builder
that skips the all-intrinsics import, in-range integer arguments, and local or RPC runners."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import types
from pathlib import Path

from ..errors import TuningError


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

    The package's __init__ parses every family's TVMScript, CUDA's above all, which is slow;
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


def export_linked(cxx: str, mod) -> str:
    """LocalBuilder f_export: a shared library linked here with `cxx`.

    MetaSchedule's default exports a tar of object files for the server to link, but a device
    server (tvmopt-rpc-server, a board without a compiler) can only load a linked library, and
    for a foreign arch only the cross compiler here can link it.
    """
    import os
    import tempfile

    from tvm.support.cc import cross_compiler

    path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod.so")
    mod.export_library(path, fcompile=cross_compiler(cxx))
    return path


# Seconds one candidate's build may take. A candidate builds in well under a second (the worker's
# start and imports are not counted); one that takes many times that is an explicit unroll of a
# large loop nest, which LLVM can take minutes over. The builder works through a batch one
# candidate at a time, so each such candidate stalls the search for this long, and a shorter
# limit returns that time to the budget.
BUILD_TIMEOUT_S = 20.0


def make_builder(timeout_sec: float = BUILD_TIMEOUT_S, workers: int = 1,
                 link_with: str | None = None):
    """A LocalBuilder that works on a 2-core machine (see load_target_intrinsics); with
    `link_with` (a C++ compiler driver) each candidate is exported as a library linked by it."""
    import functools

    from tvm.s_tir import meta_schedule as ms

    f_export = functools.partial(export_linked, link_with) if link_with else None
    return ms.builder.LocalBuilder(f_build=build_for_tuning, f_export=f_export,
                                   timeout_sec=timeout_sec, max_workers=workers)


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


def rpc_alloc_arguments(session, device, args_info, alloc_repeat):
    """RPCRunner f_alloc_argument: as alloc_arguments_in_range, on the server's device.

    Floats are filled on the server by TVM's random fill where it has one (a Python server
    with libtvm); a runtime-only server (tvmopt-rpc-server) lacks it, so their values are
    drawn here and sent. Integer tensors are zeros either way.
    """
    import numpy as np
    from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common

    try:
        remote_fill = session.get_function("tvm.contrib.random.random_fill_for_measure")
    except (AttributeError, RuntimeError, ValueError):
        remote_fill = None
    rng = np.random.default_rng(0)

    def fill(arg):
        dtype, shape = str(arg.dtype), tuple(arg.shape)
        if dtype.startswith(("int", "uint", "bool")):
            arg.copyfrom(np.zeros(shape, dtype=dtype))
        elif remote_fill is not None:
            remote_fill(arg)
        else:
            arg.copyfrom(rng.uniform(-1.0, 1.0, size=shape).astype(dtype))

    return alloc_argument_common(fill, device, args_info, alloc_repeat)


def make_runner(rpc_tracker: str | None = None, rpc_key: str | None = None,
                timeout_sec: float = 30.0, workers: int = 1):
    """LocalRunner, or RPCRunner through a tracker ('HOST:PORT') when one is given."""
    from tvm.s_tir import meta_schedule as ms

    evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=40,
                                          enable_cpu_cache_flush=False)
    if not rpc_tracker:
        from ..timing import threads

        # The runner's worker processes would otherwise start TVM's pool at its default, half
        # the logical CPUs (one thread on a 2-vCPU machine), while the schedules are generated
        # for every core and an artifact runs on every core (runtime.loader): a kernel's
        # parallel schedule then measured at half speed, and a single-threaded candidate
        # looked as good as it.
        return ms.runner.LocalRunner(timeout_sec=timeout_sec, evaluator_config=evaluator,
                                     f_alloc_argument=alloc_arguments_in_range,
                                     initializer=functools.partial(_pool_threads, threads()))
    host, port = parse_host_port(rpc_tracker)
    if not rpc_key:
        raise TuningError("--rpc-tracker needs --rpc-key (the key the servers registered with)")
    cfg = ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=rpc_key,
                              session_timeout_sec=int(timeout_sec))
    return ms.runner.RPCRunner(rpc_config=cfg, evaluator_config=evaluator, max_workers=workers,
                               f_alloc_argument=rpc_alloc_arguments)


def close_runner(runner) -> None:
    """Shut a LocalRunner's worker processes down now, not in a __del__ at exit (an RPC
    runner has none)."""
    if getattr(runner, "pool", None) is not None:
        runner.pool.shutdown()


def _pool_threads(n: str) -> None:
    """Runner worker initializer: TVM's pool takes `n` threads (read when it first starts)."""
    os.environ["TVM_NUM_THREADS"] = n


def parse_host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port), with a clear error otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise TuningError(f"'{text}': expected HOST:PORT (e.g. 127.0.0.1:9190)")
    return host, int(port)
