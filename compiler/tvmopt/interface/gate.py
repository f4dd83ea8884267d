"""The accuracy gate of a lower precision chosen for library kernels (bf16 on CPU): the last
step of compile's precision flow (the scheme offers, the timed choice measures, the gate accepts
or gives back; see `interface.compile._compile_model`).

The artifact itself runs on sample inputs (seeded random, or the user's `--calibration` file)
beside the fp32 reference (onnxruntime; the program in torch for a .pt2). The error is the
largest |output - reference| relative to the largest |reference| of the same output, over all
outputs: a number that does not depend on the model's output scale. A build over the limit
gives bf16 back kernel by kernel, the workloads that save the least time first, and is rebuilt
until it passes or nothing is left in bf16. Every attempt is printed and recorded.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import TvmoptError

# The default limit of the relative error above; `--max-error` overrides it.
DEFAULT_MAX_ERROR = 0.02
METRIC = "max |out - ref| / max |ref|, worst output"
# Rebuilds after the first before the gate gives up on bf16 altogether.
MAX_FALLBACK_STEPS = 3


@dataclass
class Attempt:
    lower_workloads: int  # library workloads computing in the lower precision
    error: float
    passed: bool
    worst_output: str = ""


@dataclass
class GateRecord:
    """What the gate measured and decided (the manifest's precision.gate)."""

    precision: str
    limit: float
    limit_from: str  # "default" or "--max-error"
    metric: str
    reference: str
    inputs: str
    attempts: list[Attempt] = field(default_factory=list)
    result: str = ""
    fp32_only: list[str] = field(default_factory=list)  # workloads taken back to fp32
    all_fp32: bool = False  # the last step took the lower precision off the table altogether

    def to_json(self) -> dict:
        return asdict(self)


def load_calibration(path: str, inputs) -> dict[str, np.ndarray]:
    """Sample inputs from an .npz holding one array per model input, named as the inputs.

    Raises:
        TvmoptError: unreadable file, a missing or extra input, or an array of the wrong rank
            or dtype kind.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as err:
        raise TvmoptError(f"--calibration {path}: cannot read it as an .npz of arrays ({err})") \
            from None
    names = [i.name for i in inputs]
    missing = [n for n in names if n not in arrays]
    extra = sorted(set(arrays) - set(names))
    if missing or extra:
        raise TvmoptError(f"--calibration {path}: arrays must be named as the model's inputs "
                          f"({', '.join(names)}); missing {missing or 'none'}, unknown "
                          f"{extra or 'none'}")
    for i in inputs:
        a = arrays[i.name]
        if i.shape is not None and len(i.shape) != a.ndim:
            raise TvmoptError(f"--calibration {path}: input '{i.name}' has shape {a.shape}; the "
                              f"model's is {list(i.shape)}")
    return arrays


def relative_error(got: dict, ref: dict) -> tuple[float, str]:
    """(the worst output's max |got - ref| / max |ref|, its name) over the float outputs."""
    worst, name = 0.0, ""
    for k, r in ref.items():
        r = np.asarray(r)
        if not np.issubdtype(r.dtype, np.floating):
            continue
        g = np.asarray(got[k], dtype=np.float64)
        r64 = r.astype(np.float64)
        scale = float(np.abs(r64).max(initial=0.0)) or 1.0
        e = float(np.abs(g - r64).max(initial=0.0)) / scale
        if np.isnan(e) or e > worst:
            worst, name = (float("inf") if np.isnan(e) else e), k
    return worst, name


def measure(artifact_path: str, model_path: str, feeds: dict) -> tuple[float, str, str]:
    """(relative error, worst output, reference name) of the artifact on `feeds`."""
    from ..runtime import verify
    from ..runtime.loader import load

    got = load(artifact_path).run(feeds)
    reference, ref = verify.reference_outputs(str(model_path), feeds)
    err, worst = relative_error(got, ref)
    return err, worst, reference


def fallback_order(choices, precision: str) -> list[str]:
    """Workloads in `precision`, least time saved first (the first to give back)."""
    lower = [c for c in choices if c.choice == "library" and c.precision == precision]

    def saved(c):
        if c.library_ms is None or c.library_bf16_ms is None:
            return 0.0
        return (c.library_ms - c.library_bf16_ms) * c.sites

    return [c.kernel for c in sorted(lower, key=saved)]


def sample_inputs(imported, opts) -> tuple[dict, str]:
    """The gate's inputs and how to describe them."""
    from ..runtime.loader import random_inputs

    if opts.calibration:
        return (load_calibration(opts.calibration, imported.inputs),
                f"--calibration {Path(opts.calibration).name}")
    return random_inputs(imported.inputs, opts.verify_dims), "seeded random (seed 0)"


def needed(choices, offered) -> bool:
    """Whether a build must pass the gate: a library call computes in a lower precision the
    scheme offered and the timing chose (bf16). The int8 calls of a QDQ model are not gated:
    they compute what the model's own quantize/dequantize steps define."""
    return any(c.choice == "library" and c.precision in offered and c.precision != "fp32"
               for c in choices)


def run(build, *, model: str, feeds: dict, described: str, max_error: float | None,
        rebuild, write_attempt, log):
    """Check `build` against the fp32 reference; while the error is over the limit, give the
    lower precision back kernel by kernel (least time saved first) and rebuild.

    Args:
        build: a build with `.records.choices` (the dispatch's Choice list).
        model: the model file the reference runs.
        rebuild: (workloads kept in fp32, whether every workload is fp32) -> a new build.
        write_attempt: (build, folder) -> path of an artifact of it, to be measured.

    Returns:
        (the build that passed, or the all-fp32 one; the GateRecord).
    """
    import tempfile

    from .. import stage

    prec = next(c.precision for c in build.records.choices
                if c.choice == "library" and c.precision not in ("fp32", "int8"))
    limit = max_error if max_error is not None else DEFAULT_MAX_ERROR
    rec = GateRecord(prec, limit, "--max-error" if max_error is not None else "default", METRIC,
                     "", described)
    given_back: list[str] = []
    stage.enter("the accuracy gate")
    with tempfile.TemporaryDirectory(prefix="tvmopt-gate-") as tmp:
        for step in range(MAX_FALLBACK_STEPS + 2):
            lower = [c for c in build.records.choices
                     if c.choice == "library" and c.precision == prec]
            if not lower:
                rec.result = f"fp32: {prec} given back on every kernel"
                log(f"precision {prec}: gate: {rec.result}")
                break
            # A fresh path per attempt: a library loaded from a path is not loaded again.
            path = write_attempt(build, Path(tmp) / f"attempt{step}")
            err, worst, rec.reference = measure(str(path), model, feeds)
            ok = err <= limit
            rec.attempts.append(Attempt(len(lower), err, ok, worst))
            log(f"precision {prec}: gate: error {err:.3g} ({METRIC}, vs {rec.reference} on "
                f"{described} inputs) with {len(lower)} {prec} library workload(s); limit "
                f"{limit:g} ({rec.limit_from}): {'passed' if ok else 'over the limit'}")
            if ok:
                rec.result = f"kept {prec} on {len(lower)} library workload(s)"
                break
            # What runs in the lower precision now, least time saved first: a rebuild re-times
            # kernels whose timings were not cached, so the set can differ from the last one.
            order = fallback_order(build.records.choices, prec)
            last = step >= MAX_FALLBACK_STEPS
            give = order if last else order[: max(1, (len(order) + 1) // 2)]
            given_back += give
            log(f"precision {prec}: gate: {len(give)} workload(s) back to fp32, rebuilding")
            # The last step takes the lower precision off the table altogether.
            rec.all_fp32 = rec.all_fp32 or last
            build = rebuild(list(given_back), last)
    rec.fp32_only = list(given_back)
    return build, rec
