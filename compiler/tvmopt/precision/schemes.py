"""Precision schemes as objects: each carries its applicability, its cost model, its decision and
the passes or library settings that realise it (mlc-llm's quantization registry is the model).

`policy.decide` runs the schemes in registry order over the plan's kernels; each scheme may
claim the model (the quantized-model schemes do, and end the decision), set kernel precisions,
and append the `Decision`s that are printed and stored. A new scheme is one class here and one
registry entry in `policy.SCHEMES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import TargetError
from ..targets.registry import HardwareTarget
from .costs import INT8_WEIGHT_FLOP_FACTOR, KernelPlan, roof_for
from .roofline import Verdict, evaluate


@dataclass
class Decision:
    """A precision considered for the model: chosen, refused or downgraded, and why."""

    precision: str
    action: str  # "chosen", "refused", "downgraded"
    reason: str


@dataclass
class Context:
    """What the schemes decide over, and what they decided so far.

    Attributes:
        library: the per-kernel library dispatch choices of this build (precision.choice.Choice):
            where a scheme is realised by library kernels (bf16 on CPU), its decision reports
            what the timing chose.
    """

    hw: HardwareTarget
    kernels: list[KernelPlan]
    requested: str
    library: list = field(default_factory=list)
    model_precision: str = "fp32"
    decisions: list = field(default_factory=list)
    done: bool = False  # a scheme claimed the model; later ones are not considered

    @property
    def order(self) -> list[str]:
        return list(self.hw.precision.get("auto_order", ["fp32"]))

    def total(self, choose) -> float:
        return sum(kernel_verdict(self.hw, k, choose(k)).time_s for k in self.kernels)

    def set_all(self, precision: str, why: str) -> None:
        for k in self.kernels:
            k.precision, k.why = precision, why

    def decide(self, precision: str, action: str, reason: str) -> None:
        self.decisions.append(Decision(precision, action, reason))


def fast(hw: HardwareTarget, dtype: str) -> bool:
    """The target lists fast instructions and a peak for `dtype`."""
    return bool(hw.fast_instructions(dtype)) and hw.peak_gflops_total(dtype) is not None


@dataclass(frozen=True)
class Scheme:
    """A precision the user can ask for (`--precision NAME`) and how tvmopt realises it.

    Attributes:
        name: the --precision name.
        description: one line for --help.
        kernel_precisions: the per-kernel precisions this scheme may assign (what a target's
            `precision.auto_order` may list).
    """

    name: str
    description: str
    kernel_precisions: tuple[str, ...] = ()

    def cost(self, k: KernelPlan, precision: str, device: str):
        """(flops, bytes, dtype whose peak applies) of `k` at `precision`, or None when this
        scheme does not price that precision."""
        return None

    def consider(self, ctx: Context) -> None:
        """Decide for the model in `ctx`: set kernel precisions, append decisions."""

    def passes(self, plan, hw: HardwareTarget) -> list:
        """Relax passes that realise the plan's choice of this scheme (run before legalization)."""
        return []

    def library_compute(self, hw: HardwareTarget, requested: str) -> tuple[str, ...]:
        """Compute precisions, besides fp32, that library kernels may use under this scheme."""
        return ()


@dataclass(frozen=True)
class Auto(Scheme):
    """Not a precision: the policy picks per target among the others."""


@dataclass(frozen=True)
class FP32(Scheme):
    def cost(self, k, precision, device):
        return (k.flops, k.bytes, "fp32") if precision == "fp32" else None


@dataclass(frozen=True)
class IntegerMatmul(Scheme):
    """A pre-quantized model's integer matmuls: kept integer only where int8 is fast."""

    def cost(self, k, precision, device):
        if precision == "int8" and k.integer_matmul:
            return k.flops, k.bytes, "int8"
        return None

    def consider(self, ctx):
        # A dynamically quantized model's integer matmuls that oneDNN's int8 kernels took are
        # library calls by now: the Choice list reports them, the kernels no longer do.
        offered = [c for c in ctx.library if getattr(c, "dynamic", False)]
        if ctx.done or not (offered or any(k.integer_matmul for k in ctx.kernels)):
            return
        hw, requested = ctx.hw, ctx.requested
        ctx.done = True
        chosen = [c for c in offered if c.choice == "library" and c.precision == "int8"]
        if chosen:
            dot = ", ".join(hw.fast_instructions("int8")) or "no int8 dot-product instructions"
            sites = sum(c.sites for c in chosen)
            # ConvInteger workloads are qconv2d_dynamic*, MatMulInteger ones qmatmul_dynamic*
            kinds = {"convolution" if c.kernel.startswith("qconv") else "matmul"
                     for c in offered}
            kind = "/".join(sorted(kinds, reverse=True))
            ctx.model_precision = "int8"
            ctx.decide("int8", "chosen", f"dynamically quantized model: int8 compute chosen for "
                       f"{len(chosen)} of {len(offered)} integer {kind} library workload(s) "
                       f"({sites} call site(s), oneDNN int8 kernels quantizing their input at "
                       f"run time; {hw.name} has {dot}), each where it timed faster than "
                       "codegen; " + ("the other integer matmuls are computed in fp32"
                                      if kind == "matmul" else "the others run as TVM kernels"))
            for k in ctx.kernels:
                if k.integer_matmul:
                    k.why = "integer matmul left to codegen: computed in fp32"
            return
        fp32_total = ctx.total(lambda k: "fp32")
        int_total = ctx.total(lambda k: "int8" if k.integer_matmul else "fp32")
        if requested not in ("auto", "int8"):
            ctx.decide("int8", "refused", f"--precision {requested}: integer matmuls of the "
                       "quantized model run in fp32")
        elif not fast(hw, "int8"):
            ctx.decide("int8", "downgraded" if requested == "int8" else "refused",
                       f"{hw.name} has no fast int8 dot-product instructions "
                       f"(needs e.g. VNNI vpdpbusd / Arm sdot); integer matmuls would run as "
                       "plain int32 multiply-adds, so they are computed in fp32 (weights "
                       "dequantized offline)")
        elif not hw.precision.get("int8_compute_path", False):
            # No target enables this yet: TVM's MatMulInteger import widens int8 to int32
            # before the matmul, and no default schedule tensorizes int8 dot products, so the
            # fast instructions would not be used.
            ctx.decide("int8", "downgraded" if requested == "int8" else "refused",
                       f"{hw.name} has {', '.join(hw.fast_instructions('int8'))}, but TVM's "
                       "MatMulInteger import widens int8 to int32 and tvmopt's pipeline has no "
                       "schedule that tensorizes int8 dot products; integer matmuls run in fp32")
        elif requested == "auto" and int_total > fp32_total:
            ctx.decide("int8", "refused", f"predicted slower than fp32 ({int_total * 1e3:.3f} "
                       f"ms vs {fp32_total * 1e3:.3f} ms)")
        else:
            ctx.model_precision = "int8"
            for k in ctx.kernels:
                if k.integer_matmul:
                    k.precision = "int8"
                    k.why = f"integer matmul on {', '.join(hw.fast_instructions('int8'))}"
            ctx.decide("int8", "chosen", "quantized matmuls keep integer compute")
        if ctx.model_precision == "fp32":
            for k in ctx.kernels:
                if k.integer_matmul:
                    k.why = ctx.decisions[-1].reason

    def passes(self, plan, hw):
        from .rewrites import integer_matmul_to_fp32_pass

        if any(k.integer_matmul and k.precision != "int8" for k in plan.kernels):
            # With int8 library kernels chosen, the matmuls they take stay integer for them.
            on_library = any(d.precision == "int8" and d.action == "chosen"
                             and d.reason.startswith("dynamically quantized")
                             for d in plan.decisions)
            return [integer_matmul_to_fp32_pass(keep_library_int8=on_library)]
        return []


@dataclass(frozen=True)
class FakeQuant(Scheme):
    """A QDQ model: the quantize/dequantize pairs run as fake quantization in fp32."""

    def consider(self, ctx):
        # The int8 library calls absorb the quantize/dequantize pairs around them: a model
        # whose every pair went into one still is a QDQ model.
        offered = [c for c in ctx.library if getattr(c, "quantized", False)
                   and not getattr(c, "dynamic", False)]
        if ctx.done or not (offered or any(k.fake_quant for k in ctx.kernels)):
            return
        ctx.done = True
        hw = ctx.hw
        dot = ", ".join(hw.fast_instructions("int8")) or "no int8 dot-product instructions"
        chosen = [c for c in offered if c.choice == "library" and c.precision == "int8"]
        if chosen:
            sites = sum(c.sites for c in chosen)
            ctx.decide("int8", "chosen", f"QDQ model: int8 compute chosen for {len(chosen)} of "
                       f"{len(offered)} quantized convolution/matmul library workload(s) "
                       f"({sites} call site(s), oneDNN int8 kernels; {hw.name} has {dot}), each "
                       "where it timed faster than the QDQ graph in fp32; the rest keep the "
                       "quantize/dequantize steps in fp32")
        elif offered:
            ctx.decide("int8", "refused", f"QDQ model: int8 library kernels timed on "
                       f"{len(offered)} quantized convolution/matmul workload(s) were faster on "
                       "none; tvmopt computes it in fp32 with the quantize/dequantize steps kept")
        else:
            ctx.decide("int8", "refused", f"QDQ model: tvmopt computes it in fp32 with the "
                       f"quantize/dequantize steps kept (outputs match onnxruntime); {hw.name} "
                       f"has {dot}, and tvmopt has no int8 lowering of QDQ")
        for k in ctx.kernels:
            if k.fake_quant:
                k.why = "QDQ fake quantization in fp32"


@dataclass(frozen=True)
class MixedFloat(Scheme):
    """fp16 or bf16 inputs with fp32 accumulation.

    On CUDA the whole graph is rewritten (ToMixedPrecision) and matmuls go to tensor cores. On
    CPUs with bf16 matrix or dot-product instructions (AMX, AVX512-BF16), bf16 runs inside the
    library's convolution and matmul kernels only, each chosen where it times faster than fp32
    (precision.choice); memory-bound and numerically sensitive ops (softmax, norms, reductions)
    stay fp32, and the build is checked against an accuracy gate (interface.gate).
    """

    def cost(self, k, precision, device):
        if precision != self.name:
            return None
        nbytes = k.bytes - k.float_bytes / 2
        is_fast = k.is_tensor_core_matmul if device == "cuda" else k.is_matrix
        return k.flops, nbytes, precision if is_fast else "fp32"

    def _candidate(self, ctx) -> bool:
        if ctx.requested == "auto":
            return self.name in ctx.order
        return ctx.requested == self.name

    def library_compute(self, hw, requested):
        on_library = (hw.device == "cpu" and self.name == "bf16" and fast(hw, "bf16")
                      and (requested == "bf16" or (requested == "auto" and "bf16" in
                                                   hw.precision.get("auto_order", []))))
        return ("bf16",) if on_library else ()

    def consider(self, ctx):
        if ctx.done or ctx.model_precision != "fp32" or not self._candidate(ctx):
            return
        hw, prec = ctx.hw, self.name
        act = "downgraded" if ctx.requested == prec else "refused"
        if not fast(hw, prec):
            ctx.decide(prec, act, f"{hw.name} has no fast {prec} instructions; fp32 kept")
            return
        if hw.device == "cpu":
            self._consider_library(ctx, act)
            return
        if prec == "bf16":
            ctx.decide(prec, act, "TVM 0.27 ToMixedPrecision produces fp16 only; no bf16 "
                       "rewrite available, fp32 kept")
            return
        fp32_total = ctx.total(lambda k: "fp32")
        total = ctx.total(lambda k: prec)
        if ctx.requested == "auto" and total >= fp32_total:
            ctx.decide(prec, "refused", f"predicted {total * 1e3:.4f} ms, not faster than fp32 "
                       f"{fp32_total * 1e3:.4f} ms")
            return
        ctx.model_precision = prec
        ctx.set_all(prec, f"{prec} inputs, fp32 accumulation (ToMixedPrecision)"
                    + ("; matmuls on tensor cores" if hw.device == "cuda" else ""))
        ctx.decide(prec, "chosen", f"predicted {total * 1e3:.4f} ms vs fp32 "
                   f"{fp32_total * 1e3:.4f} ms")

    def _consider_library(self, ctx, act):
        hw, prec = ctx.hw, self.name
        if not self.library_compute(hw, ctx.requested):
            ctx.decide(prec, act, f"{prec} on {hw.name} runs inside library convolution/matmul "
                       "kernels only, and tvmopt has none for it; fp32 kept")
            return
        offered = [c for c in ctx.library if c.library_bf16_ms is not None
                   or c.precision == prec]
        chosen = [c for c in ctx.library if c.choice == "library" and c.precision == prec]
        if not offered:
            ctx.decide(prec, act, f"no convolution or matmul of this build runs on the library "
                       f"(oneDNN), where {prec} runs on {hw.name}; fp32 kept")
            return
        if not chosen:
            ctx.decide(prec, act, f"{prec} timed on {len(offered)} library kernel(s) and was "
                       "faster on none; fp32 kept")
            return
        ctx.model_precision = prec
        saved = sum((c.library_ms - c.library_bf16_ms) * c.sites for c in chosen
                    if c.library_ms is not None and c.library_bf16_ms is not None)
        ctx.decide(prec, "chosen", f"{len(chosen)} of {len(offered)} library convolution/matmul "
                   f"workload(s) run in {prec} ({', '.join(hw.fast_instructions(prec))}), each "
                   f"where it timed faster than fp32"
                   + (f" (saves {saved:.3f} ms per inference as timed)" if saved > 0 else "")
                   + "; the rest of the graph stays fp32")

    def passes(self, plan, hw):
        from .rewrites import fp16_pass

        return [fp16_pass()] if plan.precision == "fp16" and self.name == "fp16" else []


@dataclass(frozen=True)
class WeightInt8(Scheme):
    """Weight-only int8 for memory-bound matmul/GEMV kernels with a constant weight."""

    def cost(self, k, precision, device):
        if precision == "int8_weight" and k.int8_weight_ok:
            # int8 weights plus one fp32 scale per output column (~1/K of the weight: ignored)
            return k.flops * INT8_WEIGHT_FLOP_FACTOR, k.bytes - k.weight_bytes * 3 / 4, "fp32"
        return None

    def consider(self, ctx):
        if ctx.done:
            return
        hw, requested, order = ctx.hw, ctx.requested, ctx.order
        if (requested == "auto" and ctx.model_precision == "fp32" and "fp16" not in order
                and fast(hw, "fp16")):
            ctx.decide("fp16", "refused", f"not in {hw.name}'s auto_order: mixed fp16 is used "
                       "on CUDA targets only")
        want = requested == "int8" or (requested == "auto" and "int8_weight" in order
                                       and ctx.model_precision == "fp32")
        if requested == "auto" and "int8_weight" not in order:
            ctx.decide("int8", "refused", f"not in {hw.name}'s auto_order ({', '.join(order)}): "
                       "weight-only int8 is an edge-CPU scheme")
        if not want:
            return
        picked = []
        for k in ctx.kernels:
            if not k.int8_weight_ok:
                continue
            fp32, w8 = kernel_verdict(hw, k, "fp32"), kernel_verdict(hw, k, "int8_weight")
            if requested == "int8" or (fp32.bound == "memory" and w8.time_s < fp32.time_s):
                k.precision = "int8_weight"
                k.why = (f"{fp32.bound}-bound (AI {fp32.intensity:.2f} FLOP/B): int8 weights, "
                         f"predicted {fp32.time_s / w8.time_s:.2f}x vs fp32")
                picked.append(k.name)
            else:
                k.why = (f"{fp32.bound}-bound (AI {fp32.intensity:.2f}): weight-only int8 "
                         f"predicted {w8.time_s / fp32.time_s:.2f}x the fp32 time, kept fp32")
        if picked:
            ctx.model_precision = "int8_weight"
            ctx.decide("int8", "chosen", f"weight-only int8 on {len(picked)} memory-bound "
                       "matmul/GEMV kernel(s), dequantization fused")
        else:
            ctx.decide("int8", "refused" if requested == "auto" else "downgraded",
                       "no matmul/GEMV kernel with a constant weight is predicted faster with "
                       "int8 weights")

    def passes(self, plan, hw):
        from .rewrites import int8_weight_pass

        if plan.precision == "int8_weight":
            return [int8_weight_pass(hw, force=plan.requested == "int8",
                                     wins=lambda m, k, n: int8_weight_wins(hw, m, k, n))]
        return []


# The one registry of precision schemes, in the order `policy.decide` considers them; CLI
# choices, validation, costs and passes read it.
SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Auto("auto", "the plan picks per target (fp16 on CUDA; bf16 library kernels where the CPU "
                 "has AMX/AVX512-BF16, each timed and the model checked against an accuracy "
                 "gate; weight-only int8 on edge CPUs; integer matmuls where int8 is fast), "
                 "fp32 otherwise"),
    FP32("fp32", "everything in fp32", ("fp32",)),
    IntegerMatmul("int8-integer", "a quantized model's integer matmuls", ("int8",)),
    FakeQuant("int8-qdq", "a QDQ model's fake quantization"),
    MixedFloat("fp16", "fp16 inputs, fp32 accumulation (ToMixedPrecision)", ("fp16",)),
    MixedFloat("bf16", "bf16 inputs, fp32 accumulation: ToMixedPrecision has no bf16 on CUDA; "
                       "on CPUs with AMX/AVX512-BF16, library convolutions and matmuls",
               ("bf16",)),
    WeightInt8("int8", "weight-only int8 matmuls of float models; integer matmuls of quantized "
                       "models", ("int8_weight",)),
)}
# Schemes that exist to structure the decision, not to be asked for by name.
INTERNAL = ("int8-integer", "int8-qdq")


def kernel_cost(k: KernelPlan, precision: str, device: str = "cpu") -> tuple[float, float, str]:
    """(flops, bytes, dtype whose peak applies) of kernel `k` run at `precision` on `device`:
    the first scheme that prices it; fp32 figures otherwise."""
    for s in SCHEMES.values():
        c = s.cost(k, precision, device)
        if c is not None:
            return c
    return k.flops, k.bytes, "fp32"


def kernel_verdict(hw: HardwareTarget, k: KernelPlan, precision: str) -> Verdict:
    flops, nbytes, dtype = kernel_cost(k, precision, hw.device)
    roof = roof_for(hw, dtype) or roof_for(hw, "fp32")
    if roof is None:
        raise TargetError(f"target '{hw.name}' lists no fp32 peak or memory bandwidth; "
                          "the plan needs both (see tvmopt targets show)")
    return evaluate(flops, nbytes, roof)


def int8_weight_wins(hw: HardwareTarget, m: int, k: int, n: int) -> bool:
    """The weight-only int8 rule for one matmul [m,k]x[k,n] (also used by the rewrite pass)."""
    kp = KernelPlan("matmul", ["matmul"], 2.0 * m * k * n, 4.0 * (m * k + k * n + m * n),
                    4.0 * k * n, 4.0 * (m * k + k * n + m * n), False, True)
    fp32 = kernel_verdict(hw, kp, "fp32")
    return fp32.bound == "memory" and kernel_verdict(hw, kp, "int8_weight").time_s < fp32.time_s


def library_compute(hw: HardwareTarget, requested: str) -> tuple[str, ...]:
    """The compute precisions library kernels may use for `requested` on `hw` (fp32 first)."""
    extra = [c for s in SCHEMES.values() for c in s.library_compute(hw, requested)]
    return tuple(dict.fromkeys(["fp32", *extra]))


def passes_for(plan, hw: HardwareTarget) -> list:
    """The Relax passes that realise `plan` (run in the pipeline's precision phase)."""
    return [p for s in SCHEMES.values() for p in s.passes(plan, hw)]
