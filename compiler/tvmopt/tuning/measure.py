"""Measuring candidates on a 2-core machine: the target's tensor intrinsics only, a builder
that skips the all-intrinsics import, in-range integer arguments, and local or RPC runners."""

from __future__ import annotations

import importlib
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
