"""`tvmopt bench --rpc-tracker HOST:PORT --rpc-key KEY`: the closed-loop figures of a local bench,
measured on a remote device through a TVM RPC server (`tvmopt rpc server`, or TVM's own
`python -m tvm.exec.rpc_server` on a board).

The artifact's library is uploaded once and loaded there into a Relax VM. Each timed call is
measured on the remote side (TVM's RPC time evaluator, one call per sample), so the network round
trip is not in the latency figures; it is in the first call, reported apart with the upload.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from dataclasses import asdict
from pathlib import Path

from ..errors import ArtifactError, TvmoptError, error_line
from .stats import summarize


class RemoteError(TvmoptError):
    """The RPC tracker or server cannot be reached, or the remote device cannot run the
    artifact."""


def connect(tracker: str, key: str, timeout_s: float = 30.0):
    """An RPC session on a free server of `key` at `tracker` ('HOST:PORT').

    Raises:
        RemoteError: tracker unreachable, or no server of `key` became free in time.
    """
    from tvm import rpc

    from ..tuning.measure import parse_host_port

    host, port = parse_host_port(tracker)
    try:
        # TVM's own connect retries a refused connection for a minute; one probe says it now
        socket.create_connection((host, port), timeout=10).close()
        client = rpc.connect_tracker(host, port)
    except Exception as err:  # noqa: BLE001 - any socket failure means the same to the user
        raise RemoteError(f"cannot reach the RPC tracker at {tracker}: {error_line(err)}",
                          hint="start one with 'tvmopt rpc tracker'") from None
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            return client.request(key, priority=1, session_timeout=0, max_retry=1)
        except (RuntimeError, OSError) as err:
            # No server of `key` free yet (TrackerSession.request's RuntimeError) or the
            # tracker's socket dropping: asked again until the deadline, the last one reported.
            last = err
            time.sleep(0.5)
    raise RemoteError(f"no RPC server with key '{key}' became free at {tracker} within "
                      f"{timeout_s:.0f} s ({error_line(last) if last else 'no answer'})",
                      hint=f"start one with 'tvmopt rpc server --tracker {tracker} --key {key}'")


class RemoteArtifact:
    """An artifact's library uploaded to an RPC session and loaded into a Relax VM there."""

    def __init__(self, session, artifact):
        import tvm
        from tvm import relax

        self.artifact = artifact
        lib = artifact.library
        name = f"tvmopt-{artifact.manifest['files'][lib.name][:16]}.so"
        t0 = time.perf_counter()
        try:
            session.upload(str(lib), target=name)
            self.upload_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            rlib = session.load_module(name)
            kind = artifact.manifest["target"]["device"]
            self.device = session.cpu(0) if kind == "cpu" else session.device(kind, 0)
            self.vm = relax.VirtualMachine(rlib, self.device)
        except Exception as err:  # noqa: BLE001 - the remote's reason is what matters
            t = artifact.manifest["target"]
            raise RemoteError(f"the RPC server cannot load {lib} (built for {t['name']}, "
                              f"{t['arch']}): {error_line(err)}") from None
        self.load_s = time.perf_counter() - t1
        self.upload_bytes = lib.stat().st_size
        self._tvm = tvm

    def to_device(self, feeds: dict) -> list:
        from ..frontend.narrow_types import contiguous, to_carrier

        return [self._tvm.runtime.tensor(contiguous(to_carrier(feeds[i.name])), self.device)
                for i in self.artifact.inputs]

    def first_call(self, args) -> tuple[float, list]:
        """One call timed from here (network included); the outputs as numpy."""
        from ..runtime.loader import flatten_result

        t = time.perf_counter()
        out = flatten_result(self.vm["main"](*args))
        return time.perf_counter() - t, out

    def timed(self, args, calls: int) -> list[float]:
        """Per-call latencies in seconds, measured on the remote device."""
        if calls <= 0:
            return []
        # number=1: each repeat is one call, so the samples are call latencies, as locally
        ev = self.vm.time_evaluator("main", self.device, number=1, repeat=calls)
        return [float(x) for x in ev(*args).results]


def run_remote_bench(opts, arts: dict, model: str | None, header: dict, log=print) -> dict:
    """The closed-loop part of `tvmopt bench`, on the servers of `opts.rpc_key`.

    Args:
        opts: the BenchOptions.
        arts: {batch or None (any batch): artifact path}, as bench.suite resolved them.
        model: the .onnx the artifacts came from, if known.
        header: the document's leading fields (schema, versions).

    Returns:
        A bench result document (the local schema; profile, load, soak, memory and cold start
        are None and the "remote" section holds the upload, load and first-call figures).

    Raises:
        TvmoptError: bad artifact or options; RemoteError for the RPC side.
    """
    from ..runtime.artifact import read_artifact
    from .closed_loop import ClosedLoopResult
    from .runner import InputFactory

    warnings: list[str] = []
    if opts.profile_top != 10:  # an explicit --profile-top (10 is the default)
        warnings.append("--profile-top: the per-kernel profile is not measured over RPC")
    log(f"connecting to {opts.rpc_tracker}, key '{opts.rpc_key}'")
    session = connect(opts.rpc_tracker, opts.rpc_key)
    rows, remote = [], {"tracker": opts.rpc_tracker, "key": opts.rpc_key, "loads": []}
    loaded: dict = {}
    first_art = None
    for b in opts.batches:
        path = arts[None] if None in arts else arts[b]
        if path not in loaded:
            art = read_artifact(path)
            log(f"uploading {art.library} ({art.library.stat().st_size} bytes)")
            loaded[path] = RemoteArtifact(session, art)
            ra = loaded[path]
            remote["loads"].append({"artifact": str(path), "upload_bytes": ra.upload_bytes,
                                    "upload_s": ra.upload_s, "load_s": ra.load_s})
        ra = loaded[path]
        first_art = first_art or ra.artifact
        factory = InputFactory(ra.artifact.inputs, seed=opts.seed, fixed=opts.dims)
        args = ra.to_device(factory.feeds(b))
        first_s, outs = ra.first_call(args)
        if len(outs) != len(ra.artifact.outputs):
            raise ArtifactError(f"{path}: the remote run returned {len(outs)} outputs, the "
                                f"manifest lists {len(ra.artifact.outputs)}")
        remote.setdefault("first_call_s", {})[str(b)] = first_s
        log(f"closed loop over RPC: batch {b}, {opts.warmup} warm-up + {opts.runs} timed calls")
        warm = ra.timed(args, opts.warmup)
        steady = ra.timed(args, opts.runs)
        res = ClosedLoopResult(f"tvmopt@{opts.rpc_key}", b, None,
                               summarize(warm, b) if warm else None, summarize(steady, b), steady)
        rows.append(res.to_json())
        rows[-1]["ratio_to_ort"] = None
    noisy = [f"{r['runner']}@{r['batch']} {r['steady']['cv']:.0%}" for r in rows
             if r["steady"]["noisy"]]
    if noisy:
        warnings.append("coefficient of variation above 10% (" + ", ".join(noisy) + "): "
                        "the device is too noisy to trust small differences")
    m = first_art.manifest
    return {**header,
            "host": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                     "threads": None, "tvm_threads": None},
            "artifacts": {("any" if b is None else str(b)): str(p) for b, p in arts.items()},
            "model": model, "target": m["target"]["name"], "device": m["target"]["device"],
            "options": asdict(opts), "warnings": warnings, "baselines": {},
            "closed_loop": rows, "profile": None, "load": None, "soak": None, "memory": None,
            "cold_start": None, "remote": remote}


def describe(remote: dict) -> list[str]:
    """Lines for the report: where it ran, and the upload / load / first-call figures."""
    lines = [f"remote: RPC tracker {remote['tracker']}, key '{remote['key']}'; latencies are "
             "timed on the device (the network is not in them)"]
    for ld in remote["loads"]:
        lines.append(f"  {Path(ld['artifact']).name}: upload {ld['upload_bytes'] / 2**20:.1f} MiB "
                     f"in {ld['upload_s'] * 1e3:.0f} ms, load + VM init {ld['load_s'] * 1e3:.0f} ms")
    for b, s in remote.get("first_call_s", {}).items():
        lines.append(f"  first call at batch {b} (network included): {s * 1e3:.1f} ms")
    return lines
