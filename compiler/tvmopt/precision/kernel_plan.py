"""The compilation plan: per fused kernel, what it costs on a target and which precision it gets.

`make_plan` takes the module the pipeline's front half returns (after the `fuse` phase) and, for
every fused kernel (each PrimFunc called from `main`), measures FLOPs (TVM's `estimate_tir_flops`)
and compulsory bytes (its buffers), then places it under the target's roofline
(`precision.roofline`) for every precision the target could use. The rule that chooses lives in
`precision.policy`; the planner never runs pipeline phases itself.

`compile` plans the same fused module it builds, turns the plan into passes
(`precision.schemes.passes_for`) and stores `Plan.to_json()` in the manifest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..passes.fusion_record import call_tir_calls, fused_ops, kernels_before_fusion
from ..targets.registry import HardwareTarget
from .costs import KernelPlan, roof_for
from .policy import decide, parse
from .schemes import Decision, kernel_verdict

@dataclass
class Plan:
    target: str
    device: str
    requested: str
    precision: str  # the model-level precision ("fp32", "fp16", "int8_weight", "int8", ...)
    dims: dict[str, int]
    kernels_before_fusion: int
    kernels: list[KernelPlan]
    decisions: list[Decision]
    predicted_ms: float
    predicted_fp32_ms: float
    weight_bytes: dict[str, float]
    ridge: dict[str, float] = field(default_factory=dict)
    # --dispatch auto|library: per oneDNN workload, the choice and both timings on this host
    dispatch: list[dict] = field(default_factory=list)
    dispatch_notes: list[str] = field(default_factory=list)
    # the kernels as built, where precision rewrites changed the planned fp32 ones: {name, ops,
    # flops, bytes} each, so a profile of the artifact is matched to what each kernel computes
    compiled: list[dict] = field(default_factory=list)

    @property
    def kernels_after_fusion(self) -> int:
        return len(self.kernels)

    @property
    def unestimated(self) -> list[str]:
        """Kernels whose sizes are known only at run time (their figures count those sizes as 1)."""
        return [k.name for k in self.kernels if k.unknown]

    def to_json(self) -> dict:
        d = asdict(self)
        d["kernels_after_fusion"] = self.kernels_after_fusion
        d["unestimated_kernels"] = self.unestimated
        for k in d["kernels"]:
            if k["intensity"] == float("inf"):
                k["intensity"] = None
        return d


# ------------------------------------------------------------------------------ analysis (TVM)
def _dim_value(expr, dims: dict[str, int], unknown: set[str]) -> int:
    """An integer shape expression with its symbolic dims taken from `dims` (default 1).

    A var that is not a model dim (a size computed at run time: a shape read from an input,
    NonZero's count) counts as 1 and is added to `unknown`.
    """
    from ..timing import dim_value

    return dim_value(expr, dims, unknown)


def _buffer_bytes(buf, dims: dict[str, int], unknown: set[str]) -> float:
    import tvm

    n = 1
    for s in buf.shape:
        n *= max(_dim_value(s, dims, unknown), 0)
    dt = tvm.DataType(str(buf.dtype))
    return float(n * ((dt.bits * dt.lanes + 7) // 8))


def _is_buffer(param) -> bool:
    """A buffer parameter, not a scalar (a symbolic dim passed as call_tir's tir_vars)."""
    try:
        param.shape
    except AttributeError:  # "shape is only available on a Var with BufferType": a scalar
        return False
    return True


def _is_float(dtype) -> bool:
    return str(dtype).startswith(("float", "bfloat"))


def analyze_module(fused_mod, ops_by_kernel: dict[str, list[str]],
                   dims: dict[str, int] | None = None) -> list[KernelPlan]:
    """One KernelPlan per call_tir in `main` of a fused, legalized module.

    Symbolic dims count at their `dims` value (default 1) in buffer sizes; TVM's FLOP estimate
    counts a loop of symbolic extent once.
    """
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    dims = dims or {}
    out = []
    for call in call_tir_calls(fused_mod["main"]):
        gv = call.args[0]
        func = fused_mod[gv]
        args = list(call.args[1].fields)
        params = list(func.params)  # TVM 0.27: PrimFunc params are the buffers themselves
        total = weight = floats = 0.0
        const_2d_float = 0
        in_dtypes = []
        unknown: set[str] = set()
        for idx, buf in enumerate(params):
            if not _is_buffer(buf):
                continue  # a symbolic dim passed as a scalar (call_tir's tir_vars)
            b = _buffer_bytes(buf, dims, unknown)
            total += b
            if _is_float(buf.dtype):
                floats += b
            if idx < len(args):
                in_dtypes.append(str(buf.dtype))
                if isinstance(args[idx], tvm.ir.expr.Constant):
                    weight += b
                    if len(buf.shape) == 2 and str(buf.dtype) == "float32":
                        const_2d_float += 1
        ops = ops_by_kernel.get(gv.name_hint, [gv.name_hint])
        try:
            flops = float(estimate_tir_flops(_tvm_mod_of(func, gv.name_hint)))
        except RuntimeError:
            # A statement TVM's estimator has no case for: its visitor's LOG(FATAL), an
            # InternalError (a RuntimeError). The kernel's FLOPs count as unknown in the plan.
            flops = 0.0
            unknown.add("flops")
        is_mm = any(o.startswith("matmul") for o in ops)
        integer = is_mm and any(d.startswith(("int", "uint")) for d in in_dtypes)
        out.append(KernelPlan(gv.name_hint, ops, flops, total, weight, floats, integer,
                              is_mm and const_2d_float == 1 and not integer,
                              unknown=sorted(unknown)))
    return out


def compiled_kernels(fused_mod, dims: dict[str, int] | None = None) -> list[dict]:
    """{name, ops, flops, bytes} of every fused kernel `main` of `fused_mod` calls."""
    return [{"name": k.name, "ops": k.ops, "flops": k.flops, "bytes": k.bytes}
            for k in analyze_module(fused_mod, fused_ops(fused_mod), dims)]


def _tvm_mod_of(func, name):
    import tvm

    return tvm.IRModule({name: func})


def _symbolic_dims(mod) -> list[str]:
    """The model's named dims: symbolic vars of `main`'s parameters (others are run-time sizes)."""
    from tvm import relax

    return sorted({v.name for p in mod["main"].params
                   for v in relax.analysis.definable_tir_vars_in_type(p.ty)})


def make_plan(fused_mod, hw: HardwareTarget, precision: str = "auto",
              dims: dict[str, int] | None = None, library: list | None = None) -> Plan:
    """Plan the compilation of a fused module for `hw`.

    Args:
        fused_mod: the module after the pipeline's front half (`pipeline.optimize(...,
            until="fuse")`), with no precision rewrites applied: the fp32 kernels to price.
        hw: the target.
        precision: "auto" or a scheme from `precision.policy.SCHEMES`.
        dims: values for symbolic dimensions (default 1 each).
        library: the build's per-kernel library dispatch choices (precision.choice.Choice);
            the precisions that run inside library kernels (bf16 on CPU) are decided there.

    Returns:
        The plan, with every kernel's verdict and every precision decision.

    Raises:
        TargetError: unknown precision, or the target lacks the figures a roofline needs.
    """
    parse(precision)
    dims = dict(dims or {})
    used_dims = {d: int(dims.get(d, 1)) for d in _symbolic_dims(fused_mod)}
    kernels = analyze_module(fused_mod, fused_ops(fused_mod), used_dims)
    before = kernels_before_fusion(fused_mod)
    for k in kernels:
        v = kernel_verdict(hw, k, "fp32")
        k.intensity, k.bound, k.fp32_time_us = v.intensity, v.bound, v.time_s * 1e6
    model_prec, decisions = decide(hw, kernels, precision, library)
    total = 0.0
    for k in kernels:
        v = kernel_verdict(hw, k, k.precision)
        k.time_us = v.time_s * 1e6
        k.bound = v.bound
        k.intensity = v.intensity
        total += v.time_s
    wb = sum(k.weight_bytes for k in kernels)
    w8 = sum(k.weight_bytes for k in kernels if k.int8_weight_ok)
    ridge = {d: r.ridge for d in ("fp32", "fp16", "int8") if (r := roof_for(hw, d))}
    return Plan(target=hw.name, device=hw.device, requested=precision, precision=model_prec,
                dims=used_dims, kernels_before_fusion=before if before is not None else len(kernels),
                kernels=kernels, decisions=decisions,
                predicted_ms=total * 1e3, predicted_fp32_ms=sum(k.fp32_time_us for k in kernels) / 1e3,
                weight_bytes={"fp32": wb, "fp16": wb / 2, "int8_weight": wb - w8 * 3 / 4},
                ridge=ridge)
