"""Loading an artifact and running it: input checks, the Relax VM, outputs as numpy."""

from __future__ import annotations

import os

from dataclasses import dataclass, field

import numpy as np

from .artifact import Artifact, read_artifact
from ..errors import ArtifactError, InputValueError, RunError, ShapeError, error_line
from ..frontend import run_time_checks
from ..frontend.narrow_types import by_name, contiguous, from_carrier, np_dtype, to_carrier
from ..frontend.onnx_model import nonfinite_line
from ..targets.registry import check_host_can_run
from ..tensor_info import TensorInfo


def check_inputs(expected: list[TensorInfo], given: dict[str, np.ndarray],
                 bounds: dict[str, tuple[int, int]] | None = None) -> dict[str, int]:
    """Check names, dtypes, ranks and dims of `given` against the signature.

    Args:
        bounds: symbolic dim name -> (lo, hi) the artifact was compiled for (its memory is
            planned for hi: a larger value would overrun it).

    Returns:
        The value bound to each symbolic dimension name.

    Raises:
        ShapeError: naming the input and what differs.
    """
    names = [e.name for e in expected]
    missing = [n for n in names if n not in given]
    if missing:
        raise ShapeError(f"missing input(s) {', '.join(missing)} (expected: {', '.join(names)})")
    extra = sorted(set(given) - set(names))
    if extra:
        raise ShapeError(f"unexpected input(s) {', '.join(extra)} (expected: {', '.join(names)})")
    bound: dict[str, int] = {}
    for e in expected:
        arr = given[e.name]
        if str(arr.dtype) != e.dtype:
            raise ShapeError(f"input '{e.name}': dtype {arr.dtype}, expected {e.dtype}")
        if e.shape is None:
            continue
        if arr.ndim != len(e.shape):
            raise ShapeError(f"input '{e.name}': shape {'x'.join(map(str, arr.shape)) or 'scalar'} "
                             f"has rank {arr.ndim}, expected rank {len(e.shape)} ({e.shape_str()})")
        for i, (got, want) in enumerate(zip(arr.shape, e.shape)):
            if isinstance(want, int) and got != want:
                raise ShapeError(f"input '{e.name}': dimension {i} is {got}, expected {want} "
                                 f"(shape {e.shape_str()})")
            if isinstance(want, str):
                if bound.setdefault(want, got) != got:
                    raise ShapeError(f"input '{e.name}': dimension {i} ('{want}') is {got}, but "
                                     f"'{want}' is {bound[want]} in another input")
                lo, hi = (bounds or {}).get(want, (got, got))
                if not lo <= got <= hi:
                    raise ShapeError(f"input '{e.name}': dimension {i} ('{want}') is {got}, "
                                     f"outside {lo}..{hi}, the range it was compiled for "
                                     f"(compile again with --dim {want}=LO..HI)")
    return bound


def nonfinite(arrays: dict[str, np.ndarray], kind: str) -> list[str]:
    """One line per floating-point array holding NaN or Inf, e.g. "input 'x': 3 NaN, 1 Inf
    of 64 values"; empty when every value is finite (integer arrays always are)."""
    out = []
    for name, arr in arrays.items():
        a = np.asarray(arr)
        if a.dtype.kind not in "fc":
            try:  # 8/4-bit floats (ml_dtypes) are kind 'V'; widen them to look
                a = a.astype(np.float32) if a.dtype.kind == "V" else None
            except (TypeError, ValueError):
                a = None
            if a is None:
                continue
        line = nonfinite_line(a, f"{kind} '{name}'")
        if line:
            out.append(line)
    return out


def _device_for(manifest: dict):
    import tvm

    kind = manifest["target"]["device"]
    return tvm.cpu(0) if kind == "cpu" else tvm.device(kind, 0)


@dataclass
class LoadedModel:
    """A loaded artifact, ready to run (one call at a time, as its Relax VM runs)."""

    artifact: Artifact
    vm: object
    device: object
    # run(): per input, the device tensor of the last shape fed, refilled in place. Allocating
    # a tensor per input per call costs about as much again as copying into one, which on a
    # small model is a visible part of the call.
    _staging: dict = field(default_factory=dict, repr=False, compare=False)
    _checked: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def inputs(self) -> list[TensorInfo]:
        return self.artifact.inputs

    @property
    def outputs(self) -> list[TensorInfo]:
        return self.artifact.outputs

    @property
    def dim_bounds(self) -> dict[str, tuple[int, int]]:
        """Symbolic dim name -> (lo, hi) it was compiled for (`compile --dim NAME=LO..HI`)."""
        return {k: tuple(v) for k, v in (self.artifact.manifest.get("dim_bounds") or {}).items()}

    def to_device(self, feeds: dict[str, np.ndarray]) -> list:
        import tvm

        # 8/4/2-bit inputs (ml_dtypes arrays) enter as their int8/uint8 carriers
        return [tvm.runtime.tensor(contiguous(to_carrier(feeds[i.name])), self.device)
                for i in self.inputs]

    def _staged(self, feeds: dict[str, np.ndarray]) -> list:
        """The inputs copied into run()'s own device tensors (see _staging)."""
        args = []
        for i in self.inputs:
            arr = to_carrier(np.asarray(feeds[i.name]))
            slot = self._staging.get(i.name)
            if slot is None or slot[0] != arr.shape or slot[1] != arr.dtype:
                slot = self._staging[i.name] = (arr.shape, arr.dtype, *self._stage_slot(arr))
            buf, view = slot[2], slot[3]
            if view is not None:
                np.copyto(view, arr)  # a memcpy; the tensor's own copyfrom costs twice as much
            else:
                buf.copyfrom(contiguous(arr))
            args.append(buf)
        return args

    def _stage_slot(self, arr: np.ndarray):
        """A device tensor for `arr`'s shape and dtype, and a numpy view of it where the device
        is this host's memory (None otherwise)."""
        import tvm

        buf = tvm.runtime.empty(arr.shape, str(arr.dtype), self.device)
        view = None
        if self.device.dlpack_device_type() == tvm.cpu(0).dlpack_device_type():
            try:
                view = np.from_dlpack(buf)
            except (BufferError, TypeError, ValueError, RuntimeError):
                view = None
        return buf, view

    def run_device(self, args: list):
        """Run on inputs already on the device; returns the raw VM result."""
        return self.vm["main"](*args)

    def run(self, feeds: dict[str, np.ndarray], check: bool = True) -> dict[str, np.ndarray]:
        """Run once on numpy inputs; returns outputs by name."""
        if check:
            # The same names, dtypes and shapes as the last call that passed: nothing to check.
            sig = tuple((k, getattr(v, "dtype", None), getattr(v, "shape", None))
                        for k, v in feeds.items())
            if sig != self._checked:
                check_inputs(self.inputs, feeds, self.dim_bounds)
                self._checked = sig
        try:
            result = self.run_device(self._staged(feeds))
        except InputValueError as err:  # a run-time check: its message names node and value
            raise InputValueError(str(err)) from None
        except Exception as err:  # the VM's own checks (a run-time shape or value it refuses)
            reason = error_line(err)
            shapes = ", ".join(f"{k}{list(np.shape(v))}" for k, v in feeds.items())
            raise RunError(f"running the model on inputs {shapes} failed: {reason}") from err
        arrays = flatten_result(result)
        if len(arrays) != len(self.outputs):
            raise RunError(f"the model returned {len(arrays)} arrays, its manifest lists "
                           f"{len(self.outputs)} outputs")
        return {o.name: from_carrier(arr, o.dtype) for o, arr in zip(self.outputs, arrays)}


def flatten_result(result) -> list[np.ndarray]:
    """The VM's result (a tensor or nested tuples of them) as a flat list of numpy arrays."""
    if hasattr(result, "numpy"):
        try:
            # a copy through DLPack: a tenth of .numpy()'s cost on a small output
            return [np.from_dlpack(result).copy()]
        except (BufferError, TypeError, ValueError, RuntimeError, AttributeError):
            return [result.numpy()]
    out = []
    for item in result:
        out.extend(flatten_result(item))
    return out


def _needs_onednn(art) -> bool:
    return "onednn" in ((art.manifest.get("kernels") or {}).get("requires") or [])


def _load_required_libraries(art) -> None:
    """Register the packed functions the artifact calls (the Relax VM looks them up by name)."""
    if _needs_onednn(art):
        from ..library import onednn

        try:
            onednn.load_extension()
        except Exception as err:  # noqa: BLE001 - a missing library is the user's to fix
            reason = error_line(err)
            raise ArtifactError(f"{art.path}: built with oneDNN kernels (--dispatch), but the "
                                f"oneDNN extension cannot be loaded here: {reason}; rebuild with "
                                "--dispatch codegen") from None


def load(path, check_host: bool = True) -> LoadedModel:
    """Read, verify and load an artifact.

    Raises:
        ArtifactError: bad manifest or hashes, or the library does not load.
        TargetError: this host cannot run the artifact's target.
    """
    import tvm
    from tvm import relax

    from .. import stage

    stage.enter("artifact load", str(path))
    art = read_artifact(path)
    t = art.manifest["target"]
    if t["device"] == "cpu":
        # TVM's pool takes half the logical CPUs when TVM_NUM_THREADS is unset (it takes
        # every x86 core for two hyper-threads): one thread on a 2-vCPU machine. Every core
        # is what the compile-time kernel timing assumed (timing.threads); an explicit
        # TVM_NUM_THREADS, or a pool already started in this process, wins.
        os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    if check_host:
        check_host_can_run(t["device"], t["arch"], t.get("features", []))
    _load_required_libraries(art)
    run_time_checks.register_handler()
    try:
        if _needs_onednn(art):
            from ..library import onednn

            lib = onednn.load_library(str(art.library))
        else:
            lib = tvm.runtime.load_module(str(art.library))
    except Exception as err:
        raise ArtifactError(f"{art.library}: cannot load the compiled library: "
                            f"{error_line(err)}") from None
    dev = _device_for(art.manifest)
    return LoadedModel(art, relax.VirtualMachine(lib, dev), dev)


def random_inputs(inputs: list[TensorInfo], dims: dict[str, int] | None = None,
                  seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs matching a signature; symbolic dims take `dims[name]` (default 1).

    Integer inputs (token ids, indices) are drawn small and non-negative so they stay in range
    for embedding tables; boolean inputs are drawn uniformly.
    """
    rng = np.random.default_rng(seed)
    dims = dims or {}
    out = {}
    for i in inputs:
        shape = tuple(d if isinstance(d, int) else dims.get(d, 1) for d in (i.shape or ()))
        dt = np_dtype(i.dtype)  # 'int4' is ml_dtypes' int4 (numpy reads it as int32)
        narrow = by_name(i.dtype)
        if narrow is not None and not narrow.is_float:
            lo, hi = narrow.int_range
            out[i.name] = rng.integers(lo, hi + 1, shape).astype(dt)
        elif narrow is not None:
            out[i.name] = rng.standard_normal(shape).astype(np.float32).astype(dt)
        elif dt == bool:
            out[i.name] = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(dt, np.integer):
            # an all-zero attention-mask row makes softmax NaN in every runtime: keep masks on
            out[i.name] = (np.ones(shape, dt) if "mask" in i.name.lower()
                           else rng.integers(0, 10, shape).astype(dt))
        else:
            out[i.name] = rng.standard_normal(shape).astype(dt)
    return out
