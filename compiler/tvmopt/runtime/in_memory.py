"""Build a Relax module for this host's CPU and run it once, without writing an artifact.

The accuracy report of non-fp32 builds, the ONNX conformance tool and the op tests all check
numerics this way; the artifact path (write, load, hash-check) is `runtime.loader`.
"""

from __future__ import annotations

import numpy as np


def host_target():
    """The registry target the in-memory builds use: 'x86' on x86-64, else the detected host."""
    from ..targets.registry import get_target, host_arch

    return get_target("x86") if host_arch() == "x86_64" else get_target("host")


def build_in_memory(mod, target=None, cfg=None):
    """Compile `mod` (a Relax IRModule, e.g. `ImportedModel.mod`) for a CPU target.

    Args:
        mod: the module to build.
        target: a CPU `tvm.target.Target` (default: `host_target()`).
        cfg: the `pipeline.PipelineConfig` (default: no precision passes, no database).

    Returns:
        The Relax VM executable.

    Raises:
        BuildError: optimization or code generation failed.
    """
    from .. import pipeline

    target = target if target is not None else host_target().to_tvm()
    return pipeline.build(mod, target, cfg)


def to_numpy(value):
    """A VM result as numpy: a tensor -> array, a scalar -> 0-d array, a tuple -> nested list."""
    if hasattr(value, "numpy"):
        return value.numpy()
    if isinstance(value, (int, float, bool)):
        return np.asarray(value)
    try:
        return [to_numpy(v) for v in value]
    except TypeError:
        return np.asarray(value)


def run_executable(executable, inputs, flatten: bool = True):
    """Run `main` of a CPU executable once; 8/4/2-bit inputs are passed as their carriers.

    Args:
        flatten: return a flat list of arrays; False keeps the result's nesting (`to_numpy`).

    Returns:
        The outputs as numpy arrays (carriers for 8/4/2-bit outputs).
    """
    import tvm
    from tvm import relax

    from ..frontend.narrow_types import contiguous, to_carrier
    from .loader import flatten_result

    dev = tvm.cpu()
    vm = relax.VirtualMachine(executable, dev)
    args = [tvm.runtime.tensor(contiguous(to_carrier(np.asarray(a))), dev) for a in inputs]
    out = vm["main"](*args)
    return flatten_result(out) if flatten else to_numpy(out)


def run_in_memory(mod, inputs, target=None, cfg=None) -> list[np.ndarray]:
    """Build `mod` for the host CPU and run `main` once on `inputs` (arrays in parameter order).

    Returns:
        The outputs as a flat list of numpy arrays.

    Raises:
        BuildError: the module did not build.
    """
    return run_executable(build_in_memory(mod, target, cfg), inputs)


def load_in_memory(imported, target=None, cfg=None):
    """Build an `ImportedModel` in memory and wrap it like a loaded artifact.

    Returns:
        A `runtime.loader.LoadedModel` (its `run` takes and returns named ml_dtypes/numpy
        arrays), without writing, exporting or hash-checking an artifact.
    """
    from types import SimpleNamespace

    import tvm
    from tvm import relax

    from .loader import LoadedModel

    executable = build_in_memory(imported.mod, target, cfg)
    art = SimpleNamespace(inputs=imported.inputs, outputs=imported.outputs, manifest={})
    return LoadedModel(art, relax.VirtualMachine(executable, tvm.cpu()), tvm.cpu())
