"""The precision policy: one registry of schemes, and the rule that picks among them.

    auto never picks a precision the target lacks fast instructions for, or one the plan predicts
    slower than fp32; every refusal or downgrade becomes a `Decision` that is printed and stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TargetError
from ..targets.registry import HardwareTarget
from .costs import KernelPlan, kernel_verdict


@dataclass(frozen=True)
class Scheme:
    """A precision the user can ask for (`--precision NAME`)."""

    name: str
    description: str


# The one registry of precision schemes; CLI choices and validation read it.
SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("auto", "the plan picks per target (fp16 on CUDA, weight-only int8 on edge CPUs, "
                   "integer matmuls where int8 is fast), fp32 otherwise"),
    Scheme("fp32", "everything in fp32"),
    Scheme("fp16", "fp16 inputs, fp32 accumulation (ToMixedPrecision)"),
    Scheme("bf16", "bf16 inputs (refused: TVM 0.27 has no bf16 rewrite)"),
    Scheme("int8", "weight-only int8 matmuls of float models; integer matmuls of quantized models"),
)}
CHOICES = tuple(SCHEMES)


def parse(name: str) -> Scheme:
    """The scheme called `name`.

    Raises:
        TargetError: unknown name (the message lists the choices).
    """
    if name not in SCHEMES:
        raise TargetError(f"unknown precision '{name}' (choose from {', '.join(CHOICES)})")
    return SCHEMES[name]


@dataclass
class Decision:
    """A precision considered for the model: chosen, refused or downgraded, and why."""

    precision: str
    action: str  # "chosen", "refused", "downgraded"
    reason: str



def _fast(hw: HardwareTarget, dtype: str) -> bool:
    return bool(hw.fast_instructions(dtype)) and hw.peak_gflops_total(dtype) is not None


def _total(hw, kernels, choose) -> float:
    return sum(kernel_verdict(hw, k, choose(k)).time_s for k in kernels)


def decide(hw: HardwareTarget, kernels: list[KernelPlan], requested: str) -> tuple[str, list[Decision]]:
    """Apply the precision rule; set each kernel's precision and reason. Returns (model precision,
    decisions)."""
    parse(requested)
    decisions: list[Decision] = []
    order = list(hw.precision.get("auto_order", ["fp32"]))
    fp32_total = _total(hw, kernels, lambda k: "fp32")
    has_int = any(k.integer_matmul for k in kernels)
    model_prec = "fp32"

    def set_all(prec, why):
        for k in kernels:
            k.precision, k.why = prec, why

    set_all("fp32", "fp32 baseline")

    # Pre-quantized models: keep integer matmuls only where int8 is fast and not predicted slower.
    if has_int:
        want_int = requested in ("auto", "int8")
        int_total = _total(hw, kernels, lambda k: "int8" if k.integer_matmul else "fp32")
        if not want_int:
            reason = f"--precision {requested}: integer matmuls of the quantized model run in fp32"
            decisions.append(Decision("int8", "refused", reason))
        elif not _fast(hw, "int8"):
            reason = (f"{hw.name} has no fast int8 dot-product instructions "
                      f"(needs e.g. VNNI vpdpbusd / Arm sdot); integer matmuls would run as plain "
                      "int32 multiply-adds, so they are computed in fp32 (weights dequantized offline)")
            decisions.append(Decision("int8", "downgraded" if requested == "int8" else "refused", reason))
        elif not hw.precision.get("int8_compute_path", False):
            # No target enables this yet: TVM's MatMulInteger import widens int8 to int32 before
            # the matmul, and no default schedule tensorizes int8 dot products, so the fast
            # instructions would not be used.
            reason = (f"{hw.name} has {', '.join(hw.fast_instructions('int8'))}, but TVM's "
                      "MatMulInteger import widens int8 to int32 and tvmopt's pipeline has no schedule "
                      "that tensorizes int8 dot products; integer matmuls run in fp32")
            decisions.append(Decision("int8", "downgraded" if requested == "int8" else "refused", reason))
        elif requested == "auto" and int_total > fp32_total:
            decisions.append(Decision("int8", "refused", f"predicted slower than fp32 "
                                      f"({int_total * 1e3:.3f} ms vs {fp32_total * 1e3:.3f} ms)"))
        else:
            model_prec = "int8"
            for k in kernels:
                if k.integer_matmul:
                    k.precision, k.why = "int8", f"integer matmul on {', '.join(hw.fast_instructions('int8'))}"
            decisions.append(Decision("int8", "chosen", "quantized matmuls keep integer compute"))
        if model_prec == "fp32":
            for k in kernels:
                if k.integer_matmul:
                    k.why = decisions[-1].reason
        return model_prec, decisions

    if any(k.fake_quant for k in kernels):
        # QDQ models: Q/DQ pairs import as fake quantization around fp32 ops, matching onnxruntime.
        dot = ", ".join(hw.fast_instructions("int8")) or "no int8 dot-product instructions"
        decisions.append(Decision("int8", "refused", f"QDQ model: tvmopt computes it in fp32 with "
                                  f"the quantize/dequantize steps kept (outputs match onnxruntime); "
                                  f"{hw.name} has {dot}, and tvmopt has no int8 lowering of QDQ"))
        for k in kernels:
            if k.fake_quant:
                k.why = "QDQ fake quantization in fp32"
        return model_prec, decisions

    # Float models: mixed precision (fp16/bf16) for the whole graph, or weight-only int8 per kernel.
    candidates = [p for p in ("fp16", "bf16") if p in order] if requested == "auto" else (
        [requested] if requested in ("fp16", "bf16") else [])
    for prec in candidates:
        total = _total(hw, kernels, lambda k, p=prec: p)
        if not _fast(hw, prec):
            act = "downgraded" if requested == prec else "refused"
            decisions.append(Decision(prec, act, f"{hw.name} has no fast {prec} instructions; fp32 kept"))
        elif prec == "bf16":
            act = "downgraded" if requested == prec else "refused"
            decisions.append(Decision(prec, act, "TVM 0.27 ToMixedPrecision produces fp16 only; "
                                      "no bf16 rewrite available, fp32 kept"))
        elif requested == "auto" and total >= fp32_total:
            decisions.append(Decision(prec, "refused", f"predicted {total * 1e3:.4f} ms, not faster "
                                      f"than fp32 {fp32_total * 1e3:.4f} ms"))
        else:
            model_prec = prec
            set_all(prec, f"{prec} inputs, fp32 accumulation (ToMixedPrecision)"
                    + ("; matmuls on tensor cores" if hw.device == "cuda" else ""))
            decisions.append(Decision(prec, "chosen", f"predicted {total * 1e3:.4f} ms vs fp32 "
                                      f"{fp32_total * 1e3:.4f} ms"))
            break
    if requested == "auto" and model_prec == "fp32" and "fp16" not in order and _fast(hw, "fp16"):
        decisions.append(Decision("fp16", "refused", f"not in {hw.name}'s auto_order: mixed fp16 "
                                  "is used on CUDA targets only"))

    want_w8 = (requested == "int8") or (requested == "auto" and "int8_weight" in order
                                        and model_prec == "fp32")
    if requested == "auto" and "int8_weight" not in order:
        decisions.append(Decision("int8", "refused", f"not in {hw.name}'s auto_order "
                                  f"({', '.join(order)}): weight-only int8 is an edge-CPU scheme"))
    if want_w8:
        picked = []
        for k in kernels:
            if not k.int8_weight_ok:
                continue
            fp32, w8 = kernel_verdict(hw, k, "fp32"), kernel_verdict(hw, k, "int8_weight")
            if requested == "int8" or (fp32.bound == "memory" and w8.time_s < fp32.time_s):
                k.precision = "int8_weight"
                k.why = (f"{fp32.bound}-bound (AI {fp32.intensity:.2f} FLOP/B): int8 weights, "
                         f"predicted {fp32.time_s / w8.time_s:.2f}x vs fp32")
                picked.append(k.name)
            else:
                k.why = (f"{fp32.bound}-bound (AI {fp32.intensity:.2f}): weight-only int8 predicted "
                         f"{w8.time_s / fp32.time_s:.2f}x the fp32 time, kept fp32")
        if picked:
            model_prec = "int8_weight"
            decisions.append(Decision("int8", "chosen", f"weight-only int8 on {len(picked)} "
                                      "memory-bound matmul/GEMV kernel(s), dequantization fused"))
        else:
            decisions.append(Decision("int8", "refused" if requested == "auto" else "downgraded",
                                      "no matmul/GEMV kernel with a constant weight is predicted "
                                      "faster with int8 weights"))
    return model_prec, decisions
