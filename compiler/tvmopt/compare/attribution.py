"""Split a measured latency difference B - A into named causes (pure arithmetic, no runtime).

Each model has a measured median (interleaved closed-loop runs) and a per-kernel profile taken
apart from it, in which the runtime's time outside kernels is a row of its own (onnxruntime's
session overhead; tvmopt's VM builtins). The profile gives the mix, the median the size: every
row is scaled by median / profiled total, so a busy machine that slows one run more than
another moves the total, not the shares (`profile_scale` reports the factor).

Then per cause, delta = B's time - A's time. Time outside kernels and runtime builtins belong to
`lost_fusion` (with the kernel counts); kernels no rule names are `unexplained`. By
construction the named deltas plus the unexplained part equal B - A exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .causes import CAUSE_IDS, LABELS, OTHER, Kernel

# below this share of B-A in named causes, `compare` says the explanation is incomplete
EXPLAINED_MIN = 0.8


@dataclass
class Profile:
    """One model under one runtime: its measured median and its kernels (per run)."""

    measured_ms: float
    kernels: list[Kernel]
    samples_ms: list[float] = field(default_factory=list)

    @property
    def kernel_ms(self) -> float:
        return sum(k.ms for k in self.kernels)

    @property
    def kernel_calls(self) -> float:
        return sum(k.calls for k in self.kernels if k.cause != "lost_fusion" or
                   not (k.name.startswith("vm.") or k.name.startswith("(")))

    def scaled(self) -> tuple[float, float]:
        """(scale applied to kernel times, measured time no profiled row accounts for)."""
        total = self.kernel_ms
        if total <= 0:
            return 1.0, self.measured_ms
        return self.measured_ms / total, 0.0

    def by_cause(self) -> dict[str, float]:
        """Milliseconds per cause on the measured scale (outside-kernel time in lost_fusion)."""
        scale, outside = self.scaled()
        out = {c: 0.0 for c in (*CAUSE_IDS, OTHER)}
        for k in self.kernels:
            out[k.cause] = out.get(k.cause, 0.0) + k.ms * scale
        out["lost_fusion"] += outside
        return out

    def flops_by_cause(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for k in self.kernels:
            out[k.cause] = out.get(k.cause, 0.0) + (k.flops or 0.0)
        return out


def _top_kernels(a: Profile, b: Profile, cause: str, n: int = 3) -> list[dict]:
    rows = []
    for side, p in (("a", a), ("b", b)):
        scale, _ = p.scaled()
        for k in p.kernels:
            if k.cause == cause:
                # achieved bandwidth says something only where bytes bound the kernel
                gbs = ({"gbs": k.bytes / (k.ms * scale) / 1e6} if k.bytes and k.ms > 0 and
                       cause in ("memory_bound", "low_intensity_conv", "layout", "quantize")
                       else {})
                rows.append({"model": side, "name": k.name, "op": k.op, "calls": k.calls,
                             "ms": k.ms * scale, **gbs})
    rows.sort(key=lambda r: r["ms"], reverse=True)
    return rows[:n]


def attribute(a: Profile, b: Profile, bandwidth_gbs: float | None = None,
              b_fewer_flops: bool | None = None) -> dict:
    """Attribute b.measured_ms - a.measured_ms to causes.

    Args:
        a, b: the two profiles on one runtime.
        bandwidth_gbs: the target's memory bandwidth, to report achieved bandwidth against.
        b_fewer_flops: B's graph does clearly less arithmetic than A's (None: judge from the
            profiles' FLOPs), which names a negative dense-compute delta as compute saved.

    Returns:
        {"a_ms", "b_ms", "delta_ms", "ratio", "attribution": [{cause, label, delta_ms, share,
         a_ms, b_ms, kernels, ...}], "unexplained_ms", "explained_share", "profile_scale",
         "kernel_count", "explained_ok", "unexplained_kernels"}; `share` is delta / (b - a),
         so shares of causes that cancel can exceed 1 in magnitude; named deltas +
         unexplained_ms == delta_ms.
    """
    ca, cb = a.by_cause(), b.by_cause()
    fa, fb = a.flops_by_cause(), b.flops_by_cause()
    delta = b.measured_ms - a.measured_ms
    rows = []
    for cause in CAUSE_IDS:
        d = cb[cause] - ca[cause]
        row = {"cause": cause, "label": LABELS[cause], "delta_ms": d,
               "share": d / delta if delta else 0.0, "a_ms": ca[cause], "b_ms": cb[cause],
               "a_flops": fa.get(cause, 0.0), "b_flops": fb.get(cause, 0.0),
               "kernels": _top_kernels(a, b, cause)}
        if cause == "lost_fusion":
            row["kernel_count"] = {"a": a.kernel_calls, "b": b.kernel_calls}
            row["outside_kernels_ms"] = {side: sum(k.ms * p.scaled()[0] for k in p.kernels
                                                   if k.name.startswith(("vm.", "(")))
                                         for side, p in (("a", a), ("b", b))}
        if cause == "compute" and d < 0:
            # fewer FLOPs overall: the variant saves compute; as many: it moved to other kernels
            saved = (sum(fb.values()) < 0.9 * sum(fa.values()) if b_fewer_flops is None
                     else b_fewer_flops)
            row["label"] = ("compute saved by the variant" if saved
                            else "dense compute replaced by other kernels")
        if cause in ("memory_bound", "low_intensity_conv"):
            row["achieved_gbs"] = {side: _achieved(p, cause) for side, p in (("a", a), ("b", b))}
            row["bandwidth_gbs"] = bandwidth_gbs
        rows.append(row)
    unexplained = cb[OTHER] - ca[OTHER]
    named = sum(abs(r["delta_ms"]) for r in rows)
    share = (1.0 - abs(unexplained) / abs(delta)) if delta else 1.0
    return {"a_ms": a.measured_ms, "b_ms": b.measured_ms, "delta_ms": delta,
            "ratio": b.measured_ms / a.measured_ms if a.measured_ms else None,
            "attribution": rows, "unexplained_ms": unexplained,
            "unexplained_kernels": _top_kernels(a, b, OTHER, 5),
            "explained_share": share, "explained_ok": share >= EXPLAINED_MIN,
            "gross_named_ms": named,
            "profile_scale": {"a": a.scaled()[0], "b": b.scaled()[0]},
            "noise_ms": delta_noise(a.samples_ms, b.samples_ms)}


def _achieved(p: Profile, cause: str) -> float | None:
    scale, _ = p.scaled()
    ks = [k for k in p.kernels if k.cause == cause and k.bytes]
    ms = sum(k.ms * scale for k in ks)
    return sum(k.bytes for k in ks) / ms / 1e6 if ms > 0 else None


def median_noise(samples: list[float], reps: int = 400, seed: int = 0) -> float | None:
    """Half-width of a 95% bootstrap interval of the median of `samples`, in their unit."""
    if len(samples) < 3:
        return None
    rng = np.random.default_rng(seed)
    x = np.asarray(samples)
    meds = [np.median(rng.choice(x, x.size)) for _ in range(reps)]
    lo, hi = np.percentile(meds, [2.5, 97.5])
    return float((hi - lo) / 2)


def delta_noise(a_samples: list[float], b_samples: list[float], reps: int = 400,
                seed: int = 0) -> float | None:
    """Half-width of a 95% bootstrap interval of median(B) - median(A), in ms."""
    if len(a_samples) < 3 or len(b_samples) < 3:
        return None
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a_samples), np.asarray(b_samples)
    d = [np.median(rng.choice(b, b.size)) - np.median(rng.choice(a, a.size)) for _ in range(reps)]
    lo, hi = np.percentile(d, [2.5, 97.5])
    return float((hi - lo) / 2)
