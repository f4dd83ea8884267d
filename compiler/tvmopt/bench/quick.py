"""A short latency comparison used by `tvmopt demo`: tvmopt vs onnxruntime, same inputs, one run.

Every runtime (each tvmopt build and onnxruntime) runs in a worker process of its own, timed in
blocks of alternating order with an idle gap before each (bench.isolated): in one process, or
back to back, one runtime's spinning thread pool slows the next one's calls.
"""

from __future__ import annotations


def latency_summary(artifact_path, model_path, runs: int = 50,
                    others: dict | None = None, rounds: int = 4) -> list[dict]:
    """Median and P95 latency of the artifact and of onnxruntime (threads = cores).

    Args:
        runs: timed calls per runtime, in `rounds` blocks per runtime of alternating order.
        others: label -> another artifact of the same model, timed in the same interleaved run
            (e.g. the untuned build beside the tuned one); rows come after the artifact's,
            onnxruntime last.
    """
    import os

    import numpy as np

    from ..timing import ForeignLoad
    from ..runtime.artifact import read_artifact
    from .isolated import Spec, Worker, interleaved
    from .runner import InputFactory

    # the inputs from the manifest: the workers load the builds, this process need not
    factory = InputFactory(read_artifact(artifact_path).inputs)
    feeds = factory.feeds(factory.static_batch or 1)
    threads = os.cpu_count() or 1
    specs = {"tvmopt": Spec("tvmopt", str(artifact_path))}
    specs.update({label: Spec("tvmopt", str(path)) for label, path in (others or {}).items()})
    specs["onnxruntime"] = Spec("onnxruntime", str(model_path))
    workers = {}
    try:
        for name, spec in specs.items():
            workers[name] = Worker(name, spec, threads, feeds)
        # Cores other processes keep busy meanwhile: on a shared machine the kernels' thread
        # team waits for a descheduled thread at every parallel region, and the figures stop
        # meaning much.
        with ForeignLoad() as load:
            # Long blocks: steady-state calls, as a server makes them, not mostly the first
            # ones after the idle gap that wakes each runtime's threads.
            times = interleaved(workers, runs, block=max(5, runs // max(1, rounds)))
    finally:
        for w in workers.values():
            w.close()
    foreign = load.cores
    rows = [{"runtime": name, "median_ms": float(np.median(t)),
             "p95_ms": float(np.percentile(t, 95)), "foreign_load": round(foreign, 2)}
            for name, t in times.items()]
    ort = rows[-1]["median_ms"]
    for r in rows:
        r["ratio_to_ort"] = r["median_ms"] / ort
    return rows
