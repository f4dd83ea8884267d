"""Comparing an artifact's outputs with the reference's on the same inputs: onnxruntime for an
ONNX model, the program itself run in torch for a torch.export program."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import VerificationError, error_line
from ..frontend.narrow_types import like_narrow


@dataclass
class OutputError:
    name: str
    max_abs: float
    max_rel: float
    mismatched: int  # elements outside atol + rtol * |ref|
    total: int


@dataclass
class Tolerance:
    """An element passes when |got - ref| <= atol + rtol * |ref|; with `relative_to_max`, atol
    is a fraction of the output's largest |ref| (a lower precision's gate, interface.gate)."""

    atol: float = 1e-4
    rtol: float = 1e-3
    relative_to_max: bool = False


def ort_session(model_path: str, threads: int | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])


def run_onnxruntime(model_path: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference outputs.

    Raises:
        VerificationError: onnxruntime itself cannot load or run the model on these inputs
            (e.g. a legacy export that baked its example's sequence length into a Reshape).
    """
    try:
        sess = ort_session(model_path)
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, feeds)))
    except Exception as err:  # onnxruntime raises its own Fail/InvalidArgument/RuntimeException
        shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in feeds.items())
        reason = error_line(err)
        raise VerificationError(f"the reference, onnxruntime, cannot run {model_path} on inputs "
                                f"{shapes}: {reason}") from None


def reference_outputs(model_path: str, feeds: dict[str, np.ndarray]) -> tuple[str, dict]:
    """What --verify compares with.

    Returns:
        (reference name, {output name: array})

    Raises:
        VerificationError: the reference cannot run the model on these inputs.
    """
    from ..frontend import torch_program

    if torch_program.is_torch_program(model_path):
        return "torch", torch_program.run_program(torch_program.load_program(model_path), feeds)
    return "onnxruntime", run_onnxruntime(model_path, feeds)


# onnxruntime's x86 kernels for u8 x s8 integer products multiply with vpmaddubsw on CPUs
# without VNNI, which saturates each pair of products to int16: on such hosts its MatMulInteger /
# ConvInteger results can differ from the exact integer arithmetic ONNX specifies (and tvmopt
# computes), by a quantization step on some outputs. There, a mismatch is re-checked against
# onnx.reference, the specification's own implementation.
INTEGER_PRODUCT_OPS = frozenset({"MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv",
                                 "MatMulIntegerToFloat", "DynamicQuantizeMatMul"})


def host_has_vnni() -> bool:
    """Whether this x86 host has AVX-512 VNNI or AVX-VNNI (True off x86: not concerned)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return True
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "").split()
    except OSError:
        return True
    return "avx512_vnni" in flags or "avx_vnni" in flags


def integer_product_ops(model_path: str) -> set[str]:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return {n.op_type for n in model.graph.node} & INTEGER_PRODUCT_OPS


def run_reference(model_path: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnx.reference's outputs (slow, exact); onnxruntime is the reference everywhere else."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(model_path))
    names = [o.name for o in model.graph.output]
    return dict(zip(names, ReferenceEvaluator(model).run(None, feeds)))


def compare(got: dict[str, np.ndarray], ref: dict[str, np.ndarray], tol: Tolerance,
            reference: str = "onnxruntime") -> list[OutputError]:
    errs = []
    for name, r in ref.items():
        g = np.asarray(got[name])
        r = like_narrow(r, g)  # onnxruntime gives float8 as uint8 codes
        if g.shape != r.shape:
            raise VerificationError(f"output '{name}': shape {g.shape}, {reference} gives {r.shape}")
        if r.dtype == bool or np.issubdtype(r.dtype, np.integer):
            diff = (g.astype(np.int64) != r.astype(np.int64))
            errs.append(OutputError(name, float(diff.sum() > 0), float(diff.sum() > 0),
                                    int(diff.sum()), int(r.size)))
            continue
        g64, r64 = g.astype(np.float64), r.astype(np.float64)
        both_nan = np.isnan(g64) & np.isnan(r64)
        d = np.where(both_nan, 0.0, np.abs(g64 - r64))
        d = np.where(np.isnan(d), np.inf, d)
        rel = d / np.maximum(np.abs(r64), 1e-6)
        atol = tol.atol * (float(np.nanmax(np.abs(r64), initial=0.0)) if tol.relative_to_max
                           else 1.0)
        bad = d > atol + tol.rtol * np.abs(np.nan_to_num(r64))
        errs.append(OutputError(name, float(d.max(initial=0.0)), float(rel.max(initial=0.0)),
                                int(bad.sum()), int(r.size)))
    return errs


def check(errors: list[OutputError], tol: Tolerance, reference: str = "onnxruntime") -> None:
    """Raise VerificationError when any element is outside tolerance."""
    for e in errors:
        if e.mismatched:
            raise VerificationError(
                f"output '{e.name}' differs from {reference}: max abs error {e.max_abs:.3g}, "
                f"max rel error {e.max_rel:.3g}, {e.mismatched}/{e.total} elements outside "
                + (f"{tol.atol:g} x max|ref| (the lower precision's accuracy gate)"
                   if tol.relative_to_max else f"atol={tol.atol:g} + rtol={tol.rtol:g}*|ref|"))


def to_json(errors: list[OutputError]) -> list[dict]:
    return [asdict(e) for e in errors]
