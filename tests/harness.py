"""The one test harness: build an ONNX model in memory with tvmopt and compare its outputs with
`onnx.reference.ReferenceEvaluator` (the spec's own implementation) or onnxruntime.

Built on the package's own `tvmopt.runtime.in_memory` (no artifact is written).
"""

from __future__ import annotations

import contextlib

import numpy as np
from onnx.reference import ReferenceEvaluator


def run_tvmopt(model, feeds: dict, target=None) -> list[np.ndarray]:
    """Import `model` (an onnx.ModelProto), build it for the host CPU and run it on `feeds`.

    Returns:
        The outputs, a flat list of numpy arrays.
    """
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import run_in_memory

    imported = import_onnx(model)
    names = [i.name for i in imported.inputs]
    args = [feeds[n] for n in names] if set(names) <= set(feeds) else list(feeds.values())
    return run_in_memory(imported.mod, args, target)


def compile_and_run(model, feeds: dict, folder, target: str | None = None) -> list[np.ndarray]:
    """`model` through the path a user takes: `compile_model` to an artifact folder under
    `folder`, then `runtime.load` and `run` on `feeds`.

    Returns:
        The outputs in the model's output order.
    """
    from pathlib import Path

    import onnx

    from tvmopt.interface.compile import CompileOptions, compile_model
    from tvmopt.runtime.in_memory import host_target
    from tvmopt.runtime.loader import load

    folder = Path(folder)
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    opts = CompileOptions(model=str(path), target=target or host_target().name,
                          output=str(folder / "model.tvmopt"))
    lm = load(compile_model(opts, log=lambda *_: None).artifact.path)
    outs = lm.run({i.name: feeds[i.name] for i in lm.inputs})
    return [outs[o.name] for o in lm.outputs]


def load_tvmopt(model):
    """`model` built in memory as a `LoadedModel` (named inputs and outputs, 8/4/2-bit types)."""
    from tvmopt.frontend.importer import import_onnx
    from tvmopt.runtime.in_memory import load_in_memory

    return load_in_memory(import_onnx(model))


def run_onnxruntime(model, feeds: dict) -> list[np.ndarray]:
    """onnxruntime's outputs for `model` (a ModelProto) on `feeds`."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def reference(model, feeds: dict) -> list[np.ndarray]:
    return ReferenceEvaluator(model).run(None, feeds)


def assert_close(got, want, rtol=1e-5, atol=1e-5, as_float64=True):
    """Same number of outputs, and each output's shape, dtype and values (within tolerance)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if as_float64:
            g, w = g.astype("float64"), w.astype("float64")
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def check_against_reference(model, feeds: dict, rtol=1e-5, atol=1e-6, as_float64=True):
    """Run `model` with tvmopt and with the reference evaluator; assert they agree.

    Returns:
        tvmopt's outputs.
    """
    got = run_tvmopt(model, feeds)
    assert_close(got, reference(model, feeds), rtol, atol, as_float64)
    return got


def run_first_output(model, feeds: dict) -> np.ndarray:
    return run_tvmopt(model, feeds)[0]


def check_node(node, feeds, consts=None, outputs=("y",), opset=21, rtol=1e-5, atol=1e-5):
    """A one-node model (tests.models.node_model) against the reference, in its own dtype."""
    from tests.models import node_model

    model = node_model(node, feeds, consts or {}, list(outputs), opset)
    return check_against_reference(model, feeds, rtol, atol, as_float64=False)


def check_single_output(node, feeds, consts=None, rtol=1e-5, atol=1e-5, **kw):
    """A one-node, one-output model (tests.models.single_output_model) against the reference.

    Returns:
        tvmopt's output.
    """
    from tests.models import single_output_model

    model = single_output_model(node, feeds, consts or {}, **kw)
    want = reference(model, feeds)[0]
    got = run_first_output(model, feeds)
    assert_close([got], [want], rtol, atol)
    return got


@contextlib.contextmanager
def loopback_rpc_farm(key: str, servers: int, timeout_s: float = 60):
    """A TVM RPC tracker and `servers` servers registered under `key` on 127.0.0.1, random free
    ports; yields the tracker's HOST:PORT and terminates everything afterwards."""
    from tvmopt.tuning import rpc

    procs = []
    try:
        tracker = rpc.start_tracker("127.0.0.1", rpc.free_port())
        procs.append(tracker)
        addr = f"127.0.0.1:{tracker.port}"
        for _ in range(servers):
            procs.append(rpc.start_server(addr, key, "127.0.0.1", rpc.free_port()))
        rpc.wait_for_servers(addr, key, servers, timeout_s=timeout_s)
        yield addr
    finally:
        for p in reversed(procs):
            p.terminate()


@contextlib.contextmanager
def emulated_rpc_farm(key: str, servers: int, arch: str, log_dir, timeout_s: float = 120):
    """A TVM RPC tracker on 127.0.0.1 and `servers` tvmopt-rpc-server processes for `arch`
    (under qemu-user when foreign) registered under `key`; yields (tracker HOST:PORT, the
    servers' log files) and terminates everything afterwards."""
    from pathlib import Path

    from tvmopt.edge import rpc_server
    from tvmopt.tuning import rpc

    tracker, procs, files = None, [], []
    try:
        tracker = rpc.start_tracker("127.0.0.1", rpc.free_port())
        addr = f"127.0.0.1:{tracker.port}"
        for i in range(servers):
            path = Path(log_dir) / f"rpc-server-{i}.log"
            files.append(open(path, "wb"))
            procs.append(rpc_server.start_local_server(arch, addr, key, port=rpc.free_port(),
                                                       log=lambda m: None, output=files[-1]))
        rpc.wait_for_servers(addr, key, servers, timeout_s=timeout_s)
        yield addr, [Path(f.name) for f in files]
    finally:
        for p in procs:
            rpc_server.stop(p)
        for f in files:
            f.close()
        if tracker is not None:
            tracker.terminate()
