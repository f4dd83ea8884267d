"""What the harness times: a `Runner` does one synchronous inference of a given batch.

Real runners (the tvmopt artifact, onnxruntime, PyTorch eager / torch.compile on a torch.export
program, or on an ONNX model through onnx2torch when it is installed) share one `InputFactory`, so every runner sees the same arrays for the same (batch, size).
`FakeRunner` has fixed, known service times and advances a `SimClock`, which makes every figure
the harness computes exactly predictable in tests.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from ..errors import ModelError, ShapeError
from ..tensor_info import TensorInfo


class Runner(Protocol):
    """One inference engine under test."""

    name: str

    def prepare(self, batch: int, size: int | None = None) -> None:
        """Build inputs (and anything else) for this shape, outside the timed region."""

    def run(self, batch: int, size: int | None = None) -> None:
        """One synchronous inference on the prepared inputs (results are ready on return)."""


class BaselineUnavailable(Exception):
    """A baseline cannot run this model (conversion or compilation failed); says why."""


# ------------------------------------------------------------------------------------ inputs
@dataclass
class InputFactory:
    """Deterministic inputs per (batch, size) for a model signature.

    The batch dim is the symbolic leading dim of the first input; the size dim (a sequence
    length, say) is the first other symbolic dim, if any. Static models have neither. Symbolic
    dims other than the batch take their value from `fixed` (`bench --dim`), else 1; the load
    test's request sizes override the size dim.
    """

    inputs: list[TensorInfo]
    seed: int = 0
    fixed: dict[str, int] = field(default_factory=dict)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def batch_dim(self) -> str | int | None:
        shape = self.inputs[0].shape if self.inputs else None
        return shape[0] if shape else None

    @property
    def static_batch(self) -> int | None:
        return self.batch_dim if isinstance(self.batch_dim, int) else None

    @property
    def size_dim(self) -> str | None:
        for i in self.inputs:
            for d in (i.shape or ())[1:]:
                if isinstance(d, str) and d != self.batch_dim:
                    return d
        return None

    @property
    def symbolic_dims(self) -> list[str]:
        """Every symbolic dim of the inputs, in order of first appearance."""
        names: list[str] = []
        for i in self.inputs:
            names += [d for d in (i.shape or ()) if isinstance(d, str) and d not in names]
        return names

    def dim_values(self) -> dict[str, int | str]:
        """Each symbolic dim and the value the closed loop runs it at ("--batch" for the
        batch dim, which follows the sweep)."""
        return {d: "--batch" if d == self.batch_dim else self.fixed.get(d, 1)
                for d in self.symbolic_dims}

    def dims(self, batch: int, size: int | None = None) -> dict[str, int]:
        if self.static_batch is not None and batch != self.static_batch:
            raise ShapeError(f"input '{self.inputs[0].name}' has a static batch of "
                             f"{self.static_batch}; cannot run batch {batch}",
                             hint="bench the .onnx model to recompile per batch")
        out = dict(self.fixed)
        if isinstance(self.batch_dim, str):
            out[self.batch_dim] = batch
        if self.size_dim and size is not None:
            out[self.size_dim] = size
        return out

    def feeds(self, batch: int, size: int | None = None) -> dict[str, np.ndarray]:
        key = (batch, size)
        if key not in self._cache:
            from ..runtime.loader import random_inputs

            self._cache[key] = random_inputs(self.inputs, self.dims(batch, size), seed=self.seed)
        return self._cache[key]


# ------------------------------------------------------------------------------------ real runners
class ArtifactRunner:
    """A tvmopt artifact on its device, inputs copied to the device once per shape."""

    def __init__(self, loaded, factory: InputFactory, name: str = "tvmopt"):
        self.name = name
        self.lm = loaded
        self.factory = factory
        self._args: dict = {}

    def prepare(self, batch: int, size: int | None = None) -> None:
        if (batch, size) not in self._args:
            from ..runtime.loader import check_inputs

            feeds = self.factory.feeds(batch, size)
            # The timed calls skip the checks; a dim past the bound the artifact's memory was
            # planned for (`compile --dim NAME=LO..HI`) must be refused here.
            check_inputs(self.lm.inputs, feeds, self.lm.dim_bounds)
            self._args[(batch, size)] = self.lm.to_device(feeds)

    def device_args(self, batch: int, size: int | None = None) -> list:
        """The device inputs for (batch, size), created on first use."""
        self.prepare(batch, size)
        return self._args[(batch, size)]

    def run(self, batch: int, size: int | None = None) -> None:
        self.lm.run_device(self.device_args(batch, size))
        self.lm.device.sync()  # GPU launches are asynchronous; time the work, not the launch


class OrtRunner:
    """onnxruntime, CPU execution provider, intra-op threads = `threads`."""

    def __init__(self, model_path: str, factory: InputFactory, threads: int):
        from ..frontend.torch_program import is_torch_program
        from ..runtime.verify import ort_session

        if is_torch_program(model_path):
            raise BaselineUnavailable("onnxruntime runs ONNX models; this is a torch.export "
                                      "program (bench its .onnx export for this baseline)")
        self.name = "onnxruntime"
        self.factory = factory
        self.sess = ort_session(str(model_path), threads=threads)

    def prepare(self, batch: int, size: int | None = None) -> None:
        self.factory.feeds(batch, size)

    def run(self, batch: int, size: int | None = None) -> None:
        self.sess.run(None, self.factory.feeds(batch, size))


# onnx2torch is not a dependency: it requires torchvision, which cannot load beside the CPU torch
# tvmopt pins and then breaks transformers too. Installed without its dependencies it works.
ONNX2TORCH_HINT = "pip install --no-deps onnx2torch==1.5.15"


def _import_onnx2torch():
    """Import onnx2torch, which imports torchvision only for its NMS and RoiAlign converters.

    Without a torchvision that loads (none installed, or PyPI's CUDA build beside the CPU
    torch), those two converters are given a stand-in that raises on use, so every other model
    still converts and an NMS model fails loudly.
    """
    try:
        import torchvision  # noqa: F401
    except Exception as err:  # ImportError, or RuntimeError from a mismatched build
        reason = f"torchvision unavailable ({type(err).__name__}: {str(err)[:80]})"
        for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[mod]

        def _missing(*_a, **_k):
            raise BaselineUnavailable(f"this model needs torchvision ops: {reason}")

        tv = types.ModuleType("torchvision")
        tv.ops = types.ModuleType("torchvision.ops")
        tv.ops.nms = tv.ops.box_convert = tv.ops.roi_align = _missing
        sys.modules["torchvision"] = tv
        sys.modules["torchvision.ops"] = tv.ops
    try:
        import onnx2torch
    except ImportError as err:
        raise BaselineUnavailable(f"the torch baseline of an ONNX model needs onnx2torch, which "
                                  f"is not installed ({ONNX2TORCH_HINT} adds it without "
                                  "torchvision); a .pt2 model needs nothing more") from None
    return onnx2torch


def _torch_module(model_path: str):
    """The torch module a torch baseline runs (a .pt2 program's own module, or the ONNX model
    converted by onnx2torch) and how to call it with the inputs as one flat list."""
    from ..frontend.torch_program import flat_callable, is_torch_program, load_program

    if is_torch_program(model_path):
        ep = load_program(model_path)
        return ep.module(), lambda module: flat_callable(ep, module)
    from ..frontend.onnx_model import load_onnx

    onnx2torch = _import_onnx2torch()
    try:
        return onnx2torch.convert(load_onnx(model_path)).eval(), lambda module: module
    except ModelError:
        raise
    except Exception as err:
        raise BaselineUnavailable(f"onnx2torch cannot convert {model_path}: "
                                  f"{type(err).__name__}: {str(err).strip()[:160]}") from None


class TorchRunner:
    """PyTorch eager, or torch.compile, on a torch.export program's module, or on an ONNX model
    converted by onnx2torch."""

    def __init__(self, model_path: str, factory: InputFactory, threads: int,
                 compiled: bool = False):
        import torch

        self.name = "torch.compile" if compiled else "torch"
        self.factory = factory
        self.compiled = compiled
        torch.set_num_threads(threads)
        module, flat = _torch_module(model_path)
        self.module = module
        self.fn = flat(module)
        if compiled:
            try:
                self.fn = flat(torch.compile(module, dynamic=True))
            except Exception as err:
                raise BaselineUnavailable(f"torch.compile failed: {type(err).__name__}: "
                                          f"{str(err).strip()[:160]}") from None
        self._tensors: dict = {}

    def prepare(self, batch: int, size: int | None = None) -> None:
        import torch

        key = (batch, size)
        if key in self._tensors:
            return
        feeds = self.factory.feeds(batch, size)
        self._tensors[key] = [torch.from_numpy(np.ascontiguousarray(feeds[i.name]))
                              for i in self.factory.inputs]
        try:  # the first call converts/compiles lazily: do it here, and fail here, not timed
            with torch.inference_mode():
                self.fn(*self._tensors[key])
        except Exception as err:
            raise BaselineUnavailable(f"{self.name} fails on batch {batch}: "
                                      f"{type(err).__name__}: {str(err).strip()[:160]}") from None

    def run(self, batch: int, size: int | None = None) -> None:
        import torch

        self.prepare(batch, size)
        with torch.inference_mode():
            self.fn(*self._tensors[(batch, size)])


class OpenVinoRunner:
    """OpenVINO on the CPU, `threads` inference threads, latency mode; with its default
    precision (bf16 on CPUs with AMX) or an explicit hint ("f32"). The precision that ran is
    read back from the compiled model."""

    def __init__(self, model_path: str, factory: InputFactory, threads: int,
                 precision: str | None = None):
        from ..frontend.torch_program import is_torch_program

        if is_torch_program(model_path):
            raise BaselineUnavailable("OpenVINO reads ONNX models here; this is a torch.export "
                                      "program (bench its .onnx export for this baseline)")
        try:
            import openvino as ov
        except ImportError:
            raise BaselineUnavailable("OpenVINO is not installed (pip install "
                                      "'tvmopt[baselines]')") from None
        self.name = "openvino" + (f"-{precision}" if precision else "")
        self.factory = factory
        config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        try:
            self.compiled = ov.Core().compile_model(str(model_path), "CPU", config)
        except Exception as err:
            raise BaselineUnavailable(f"OpenVINO cannot compile it: {type(err).__name__}: "
                                      f"{str(err).strip().splitlines()[0][:160]}") from None
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")  # an ov.Type
        self.precision = getattr(hint, "get_type_name", lambda: str(hint))()
        self.request = self.compiled.create_infer_request()

    def prepare(self, batch: int, size: int | None = None) -> None:
        self.request.infer(self.factory.feeds(batch, size))

    def run(self, batch: int, size: int | None = None) -> None:
        self.request.infer(self.factory.feeds(batch, size))


BASELINE_RUNNERS = {
    "ort": ("OrtRunner", {}),
    "openvino": ("OpenVinoRunner", {}),
    "openvino-f32": ("OpenVinoRunner", {"precision": "f32"}),
    "torch": ("TorchRunner", {}),
    "torch.compile": ("TorchRunner", {"compiled": True}),
}


def _serve_runner(conn, baseline: str, model_path: str, inputs, seed: int, threads: int,
                  fixed: dict | None = None):
    """A baseline's worker process: builds the runner, then prepares and runs on request,
    timing each call itself (the pipe's round trip is not part of the figure)."""
    import os
    import time

    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    try:
        cls, kwargs = BASELINE_RUNNERS[baseline]
        runner = globals()[cls](model_path, InputFactory(inputs, seed=seed, fixed=fixed or {}),
                                threads, **kwargs)
        conn.send(("ready", runner.name, getattr(runner, "precision", None)))
    except BaselineUnavailable as err:
        conn.send(("unavailable", str(err), None))
        return
    except Exception as err:  # noqa: BLE001 - reported as the baseline being unavailable
        conn.send(("unavailable", f"{type(err).__name__}: {str(err).strip()[:160]}", None))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the harness is gone (it stopped on an error of its own)
            return
        try:
            if msg[0] == "prepare":
                runner.prepare(*msg[1:])
                conn.send(("ok",))
            elif msg[0] == "run":
                t0 = time.perf_counter()
                runner.run(*msg[1:])
                conn.send(("ran", time.perf_counter() - t0))
            else:
                return
        except BaselineUnavailable as err:
            conn.send(("unavailable", str(err)))
        except Exception as err:  # noqa: BLE001
            conn.send(("unavailable", f"{type(err).__name__}: {str(err).strip()[:160]}"))


class ProcessRunner:
    """A baseline in a worker process of its own, so its thread pool never competes with
    tvmopt's or another baseline's inside one process. Each call is timed in the worker
    (`measured_s`), which the harness uses instead of its own clock around the pipe."""

    def __init__(self, baseline: str, model_path: str, factory: InputFactory, threads: int):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_runner, daemon=True, args=(
            child, baseline, str(model_path), factory.inputs, factory.seed, threads,
            factory.fixed))
        self._proc.start()
        kind, text, precision = self._conn.recv()
        if kind != "ready":
            self._proc.join(5)
            raise BaselineUnavailable(text)
        self.name, self.precision = text, precision
        self.measured_s = None

    def _ask(self, *msg):
        self._conn.send(msg)
        reply = self._conn.recv()
        if reply[0] == "unavailable":
            raise BaselineUnavailable(reply[1])
        return reply

    def prepare(self, batch: int, size: int | None = None) -> None:
        self._ask("prepare", batch, size)

    def run(self, batch: int, size: int | None = None) -> None:
        self.measured_s = self._ask("run", batch, size)[1]

    def close(self) -> None:
        from .isolated import stop

        stop(self._conn, self._proc)


# ------------------------------------------------------------------------------------ fake
class FakeRunner:
    """Fixed, known service times on a simulated clock.

    Args:
        clock: the SimClock to advance.
        service_s: seconds one call of (batch, size) takes; or
        times_s: a list of per-call service times, cycled in order (for exact percentile tests).
    """

    def __init__(self, clock, service_s: Callable[[int, int | None], float] | None = None,
                 times_s: list[float] | None = None, name: str = "fake"):
        if (service_s is None) == (times_s is None):
            raise ValueError("give exactly one of service_s or times_s")
        self.name = name
        self.clock = clock
        self.service_s = service_s
        self.times_s = list(times_s or [])
        self.calls: list[tuple[int, int | None]] = []

    @classmethod
    def linear(cls, clock, fixed_s: float, per_item_s: float, name: str = "fake") -> "FakeRunner":
        """Service time = fixed_s + per_item_s * batch: batching amortizes the fixed part."""
        return cls(clock, service_s=lambda b, s=None: fixed_s + per_item_s * b, name=name)

    def prepare(self, batch: int, size: int | None = None) -> None:
        pass

    def service_time(self, batch: int, size: int | None = None) -> float:
        if self.service_s is not None:
            return self.service_s(batch, size)
        return self.times_s[len(self.calls) % len(self.times_s)]

    def run(self, batch: int, size: int | None = None) -> None:
        dt = self.service_time(batch, size)
        self.calls.append((batch, size))
        self.clock.sleep(dt)
