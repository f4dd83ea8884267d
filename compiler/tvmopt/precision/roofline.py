"""The roofline model: is a kernel limited by arithmetic or by memory traffic, and how long it takes.

Pure arithmetic (no TVM): `tvmopt.precision.kernel_plan` measures FLOPs and bytes of each fused kernel and asks
this module for the verdict on a target. The model (Williams, Waterman, Patterson, "Roofline: an
insightful visual performance model for multicore architectures", CACM 52(4), 2009):

    time = max(flops / peak_flops, bytes / bandwidth)
    arithmetic intensity AI = flops / bytes;  ridge point = peak_flops / bandwidth
    AI < ridge -> memory-bound, else compute-bound.

Bytes are the kernel's compulsory traffic: every input and output buffer read or written once
(intermediates of a fused kernel stay on chip). Peaks are the whole device's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Roof:
    """The two roofs of one target at one precision."""

    peak_gflops: float  # GFLOP/s (GOP/s for integer math), whole device
    bandwidth_gbs: float  # GB/s main memory

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the kernel stops being memory-bound."""
        return self.peak_gflops / self.bandwidth_gbs


@dataclass(frozen=True)
class Verdict:
    """A kernel's place under a roof."""

    flops: float
    bytes: float
    intensity: float  # FLOP/byte (inf for a kernel that moves no bytes)
    bound: str  # "compute" or "memory"
    time_s: float
    compute_s: float
    memory_s: float


def intensity(flops: float, nbytes: float) -> float:
    """FLOPs per byte moved; infinite when nothing is moved."""
    return flops / nbytes if nbytes > 0 else float("inf")


def evaluate(flops: float, nbytes: float, roof: Roof) -> Verdict:
    """Place a kernel with `flops` operations and `nbytes` of traffic under `roof`.

    Args:
        flops: arithmetic operations (a multiply-add counts as 2).
        nbytes: bytes read plus bytes written.
        roof: the target's peak and bandwidth for the kernel's precision.

    Returns:
        The verdict: predicted time is the larger of compute time and memory time.
    """
    if roof.peak_gflops <= 0 or roof.bandwidth_gbs <= 0:
        raise ValueError(f"roof needs positive peak and bandwidth, got {roof}")
    compute_s = flops / (roof.peak_gflops * 1e9)
    memory_s = nbytes / (roof.bandwidth_gbs * 1e9)
    ai = intensity(flops, nbytes)
    bound = "compute" if compute_s >= memory_s else "memory"
    return Verdict(flops, nbytes, ai, bound, max(compute_s, memory_s), compute_s, memory_s)


def matmul_cost(m: int, n: int, k: int, a_bytes: int = 4, b_bytes: int = 4,
                c_bytes: int = 4) -> tuple[float, float]:
    """FLOPs and compulsory bytes of C[m,n] = A[m,k] @ B[k,n] (for checks and examples)."""
    return 2.0 * m * n * k, float(m * k * a_bytes + k * n * b_bytes + m * n * c_bytes)
