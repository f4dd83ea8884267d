"""Peak memory: resident set size sampled during a run, and the process's lifetime peak."""

from __future__ import annotations

import os
import resource
import subprocess
import threading
import time


def rss_bytes() -> int:
    """Current resident set size of this process."""
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss


def lifetime_peak_rss_bytes() -> int:
    """ru_maxrss: the highest RSS this process ever had (kilobytes on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RssSampler:
    """Samples RSS on a background thread while the `with` block runs.

    The lifetime peak (ru_maxrss) also counts importing and compiling; the sampled peak covers
    only the benchmark, which is what a deployment pays.
    """

    def __init__(self, interval_s: float = 0.01):
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self):
        t0 = time.perf_counter()
        while not self._stop.is_set():
            self.samples.append((time.perf_counter() - t0, rss_bytes()))
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self.samples.append((0.0, rss_bytes()))
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tvmopt-rss")
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.samples.append((self.samples[-1][0], rss_bytes()))

    @property
    def peak(self) -> int:
        return max(r for _, r in self.samples)

    @property
    def start(self) -> int:
        return self.samples[0][1]


def gpu_memory_bytes(device_kind: str) -> int | None:
    """GPU memory this process holds (CUDA, via nvidia-smi); None elsewhere or when unknown."""
    if device_kind != "cuda":
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(os.getpid()):
            return int(parts[1]) * 1024 * 1024
    return None


def memory_report(sampler: RssSampler, device_kind: str) -> dict:
    """The JSON 'memory' section."""
    return {"rss_start_bytes": sampler.start, "rss_peak_bytes": sampler.peak,
            # ru_maxrss and psutil round differently: keep lifetime >= the sampled peak
            "rss_lifetime_peak_bytes": max(lifetime_peak_rss_bytes(), sampler.peak),
            "gpu_bytes": gpu_memory_bytes(device_kind),
            "gpu_note": None if device_kind == "cuda" else f"not applicable ({device_kind} artifact)"}
