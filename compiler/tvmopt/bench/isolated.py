"""Each runtime in its own worker process, timed in rounds of alternating order.

Thread pools of one runtime slow the next one in the same process (onnxruntime's and OpenMP's
workers keep spinning after a call; two pools on two cores take turns), so a fair comparison
runs every runtime in a process of its own. A worker loads its model once, then blocks on its
pipe (no spinning) until asked to time a block of calls, which it times itself: the pipe's
latency is never part of a figure. Between blocks every worker is idle for a short gap, and the
order of the runtimes alternates from round to round.

Runtimes: "tvmopt" (an artifact folder), "onnxruntime" and "openvino" (an .onnx file; OpenVINO
with its default precision, which is bf16 on AMX CPUs, or with `precision="f32"`), and "torch"
(a module built by a caller-named function, for the tools).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import TvmoptError

GAP_S = 0.2  # idle time before each block: the previous runtime's spinning threads wind down
KINDS = ("tvmopt", "onnxruntime", "openvino", "torch")


@dataclass
class Spec:
    """What one worker runs.

    Attributes:
        kind: one of KINDS.
        path: the artifact folder (tvmopt) or the .onnx file (onnxruntime, openvino).
        precision: OpenVINO's inference precision hint ("f32"); None: its default.
        builder: for torch, "module:function" returning the nn.Module; `builder_args` its args.
        env: extra environment for the worker (set before any runtime is imported).
    """

    kind: str
    path: str = ""
    precision: str | None = None
    builder: str = ""
    builder_args: tuple = ()
    env: dict = field(default_factory=dict)
    sys_path: tuple = ()


def _make_runtime(spec: Spec, threads: int):
    """(run(feeds) -> {name: array}, info dict) inside the worker."""
    if spec.kind == "tvmopt":
        import tvmopt

        lm = tvmopt.load(spec.path)
        return (lambda feeds: lm.run(feeds)), {
            "precision": lm.artifact.manifest["precision"]["default"]}
    if spec.kind == "onnxruntime":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        sess = ort.InferenceSession(spec.path, so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return (lambda feeds: dict(zip(names, sess.run(None, feeds)))), {
            "version": ort.__version__}
    if spec.kind == "openvino":
        try:
            import openvino as ov
        except ImportError:
            raise TvmoptError("the openvino baseline needs OpenVINO: pip install "
                              "'tvmopt[baselines]' (or pip install openvino)") from None
        core = ov.Core()
        config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
        if spec.precision:
            config["INFERENCE_PRECISION_HINT"] = spec.precision
        compiled = core.compile_model(spec.path, "CPU", config)
        request = compiled.create_infer_request()
        names = [o.get_any_name() for o in compiled.outputs]

        def run(feeds):
            res = request.infer(feeds)
            return {n: np.asarray(res[o]) for n, o in zip(names, compiled.outputs)}

        # What ran, read back: OpenVINO may not honour a hint the CPU cannot do.
        hint = compiled.get_property("INFERENCE_PRECISION_HINT")  # an ov.Type
        return run, {"precision": getattr(hint, "get_type_name", lambda: str(hint))(),
                     "version": ov.get_version()}
    if spec.kind == "torch":
        import importlib

        import torch

        torch.set_num_threads(threads)
        mod_name, fn = spec.builder.split(":")
        model = getattr(importlib.import_module(mod_name), fn)(*spec.builder_args).eval()

        def run(feeds):
            with torch.inference_mode():
                out = model(*[torch.from_numpy(v) for v in feeds.values()])
            out = out if isinstance(out, (tuple, list)) else [out]
            return {f"output{i}": o.numpy() for i, o in enumerate(out)}

        return run, {"version": torch.__version__}
    raise TvmoptError(f"unknown runtime '{spec.kind}' (choose from {', '.join(KINDS)})")


def enter_worker(spec: Spec, threads: int) -> None:
    """A worker process's environment, before its runtime loads: the spec's variables, the
    thread counts (unless the spec set them) and its sys.path."""
    import sys

    os.environ.update({k: str(v) for k, v in spec.env.items()})
    os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    sys.path[:0] = list(spec.sys_path)


def _serve(conn, spec: Spec, threads: int, feeds: dict) -> None:
    """The worker: load, then answer requests until told to stop."""
    enter_worker(spec, threads)
    try:
        run, info = _make_runtime(spec, threads)
        run(feeds)  # first call: weight reorders, lazy compilation
        conn.send(("ready", info))
    except Exception as err:  # noqa: BLE001 - reported to the parent, which names the runtime
        conn.send(("error", f"{type(err).__name__}: {err}".splitlines()[0]))
        return
    while True:
        msg = conn.recv()
        if msg[0] == "time":
            ms = []
            for _ in range(msg[1]):
                t0 = time.perf_counter()
                run(feeds)
                ms.append((time.perf_counter() - t0) * 1e3)
            conn.send(("times", ms))
        elif msg[0] == "outputs":
            conn.send(("outputs", run(feeds)))
        else:
            return


class Worker:
    """A runtime in its own process; blocks on its pipe while another runtime is timed."""

    def __init__(self, name: str, spec: Spec, threads: int, feeds: dict):
        self.name = name
        ctx = mp.get_context("spawn")  # a fresh interpreter: no thread pool inherited
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, spec, threads, feeds), daemon=True)
        self._proc.start()
        kind, payload = self._conn.recv()
        if kind == "error":
            self._proc.join(5)
            raise TvmoptError(f"runtime {name}: {payload}")
        self.info = payload

    def time(self, calls: int) -> list[float]:
        self._conn.send(("time", calls))
        return self._conn.recv()[1]

    def outputs(self) -> dict:
        self._conn.send(("outputs",))
        return self._conn.recv()[1]

    def close(self) -> None:
        stop(self._conn, self._proc)


def stop(conn, proc) -> None:
    """Ask a worker to stop; kill it if it does not within a few seconds."""
    try:
        conn.send(("stop",))
    except (BrokenPipeError, OSError):
        pass
    proc.join(10)
    if proc.is_alive():
        proc.kill()


def interleaved(workers: dict[str, Worker], runs: int, block: int = 5,
                gap_s: float = GAP_S) -> dict[str, np.ndarray]:
    """ms per call of each worker: rounds of `block` calls per worker (after one untimed call),
    the order reversed every other round, an idle gap before each block; `runs` calls each."""
    times = {k: [] for k in workers}
    names = list(workers)
    rnd = 0
    while min(len(v) for v in times.values()) < runs:
        for name in (names if rnd % 2 == 0 else names[::-1]):
            time.sleep(gap_s)
            # the first call after the gap wakes sleeping threads: not a steady-state figure
            times[name] += workers[name].time(block + 1)[1:]
        rnd += 1
    return {k: np.asarray(v[:runs]) for k, v in times.items()}
