"""The compilation plan: per fused kernel, what it costs on a target and which precision it gets.

`make_plan` imports the model with static shapes (symbolic dims bound to `dims`, default 1), runs
tvmopt's own pipeline up to and including the `fuse` phase, and for every fused kernel (each
PrimFunc called from `main`) measures FLOPs (TVM's `estimate_tir_flops`) and compulsory bytes (its
buffers), then places it under the target's roofline (`analysis.roofline`) for every precision the
target could use. The precision rule lives here, in one place:

    auto never picks a precision the target lacks fast instructions for, or one the plan predicts
    slower than fp32; every refusal or downgrade becomes a `Decision` that is printed and stored.

`compile` calls the same function, turns the plan into passes (`tvmopt.precision.rewrites`) and stores
`Plan.to_json()` in the manifest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .roofline import Roof, Verdict, evaluate
from ..errors import TargetError, TvmoptError
from ..targets.registry import HardwareTarget

CHOICES = ("auto", "fp32", "fp16", "bf16", "int8")
# Ops whose arithmetic runs on the target's matrix units (tensor cores, dot-product instructions).
_MATRIX_OPS = ("matmul", "conv", "dense", "batch_matmul")
# On CUDA only matmuls get tensor cores from dlight (its Matmul rule); conv2d kernels do not (seen
# on the bundled CNNs), so the plan prices them at the fp32 peak with fp16 bytes.
_TENSOR_CORE_OPS = ("matmul", "dense", "batch_matmul")
# Weight-only int8 converts each weight element to fp32 inside the inner loop: one extra op per
# multiply-add, so 1.5x the FLOPs of the fp32 kernel (the dequantization overhead).
INT8_WEIGHT_FLOP_FACTOR = 1.5


@dataclass
class KernelPlan:
    """One fused kernel under the roofline."""

    name: str
    ops: list[str]
    flops: float
    bytes: float
    weight_bytes: float  # constant (weight) inputs, fp32 storage
    float_bytes: float  # all floating-point buffers (what fp16 halves)
    integer_matmul: bool  # a pre-quantized model's integer matmul
    int8_weight_ok: bool  # a matmul/GEMV with one constant 2-D fp32 weight
    intensity: float = 0.0
    bound: str = ""
    precision: str = "fp32"
    why: str = ""
    time_us: float = 0.0
    fp32_time_us: float = 0.0

    @property
    def is_matrix(self) -> bool:
        return any(op.startswith(m) for op in self.ops for m in _MATRIX_OPS)

    @property
    def fake_quant(self) -> bool:
        """Holds QDQ (QuantizeLinear/DequantizeLinear) ops: a QDQ model's fake quantization."""
        return any(op.startswith(("quantize", "dequantize")) for op in self.ops)

    @property
    def is_tensor_core_matmul(self) -> bool:
        return any(op.startswith(m) for op in self.ops for m in _TENSOR_CORE_OPS)


@dataclass
class Decision:
    """A precision considered for the model: chosen, refused or downgraded, and why."""

    precision: str
    action: str  # "chosen", "refused", "downgraded"
    reason: str


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

    @property
    def kernels_after_fusion(self) -> int:
        return len(self.kernels)

    def int8_weight_kernels(self) -> list[str]:
        return [k.name for k in self.kernels if k.precision == "int8_weight"]

    def to_json(self) -> dict:
        d = asdict(self)
        d["kernels_after_fusion"] = self.kernels_after_fusion
        for k in d["kernels"]:
            if k["intensity"] == float("inf"):
                k["intensity"] = None
        return d


# ------------------------------------------------------------------------------ cost per precision
def roof_for(hw: HardwareTarget, dtype: str) -> Roof | None:
    """The roof of `hw` at `dtype`, or None when the file gives no peak or bandwidth for it."""
    peak, bw = hw.peak_gflops_total(dtype), hw.bandwidth_gbs()
    if peak is None or bw is None:
        return None
    return Roof(peak, bw)


def kernel_cost(k: KernelPlan, precision: str, device: str = "cpu") -> tuple[float, float, str]:
    """(flops, bytes, dtype whose peak applies) of kernel `k` run at `precision` on `device`."""
    if precision in ("fp16", "bf16"):
        nbytes = k.bytes - k.float_bytes / 2
        fast = k.is_tensor_core_matmul if device == "cuda" else k.is_matrix
        return k.flops, nbytes, precision if fast else "fp32"
    if precision == "int8_weight" and k.int8_weight_ok:
        # int8 weights plus one fp32 scale per output column (~1/K of the weight: ignored)
        nbytes = k.bytes - k.weight_bytes * 3 / 4
        return k.flops * INT8_WEIGHT_FLOP_FACTOR, nbytes, "fp32"
    if precision == "int8" and k.integer_matmul:
        return k.flops, k.bytes, "int8"
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


# ------------------------------------------------------------------------------ precision policy
def _fast(hw: HardwareTarget, dtype: str) -> bool:
    return bool(hw.fast_instructions(dtype)) and hw.peak_gflops_total(dtype) is not None


def _total(hw, kernels, choose) -> float:
    return sum(kernel_verdict(hw, k, choose(k)).time_s for k in kernels)


def decide(hw: HardwareTarget, kernels: list[KernelPlan], requested: str) -> tuple[str, list[Decision]]:
    """Apply the precision rule; set each kernel's precision and reason. Returns (model precision,
    decisions)."""
    if requested not in CHOICES:
        raise TargetError(f"unknown precision '{requested}' (choose from {', '.join(CHOICES)})")
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


# ------------------------------------------------------------------------------ analysis (TVM)
def _static_shapes(inputs, dims: dict[str, int]) -> dict[str, tuple[int, ...]]:
    return {i.name: tuple(d if isinstance(d, int) else int(dims.get(d, 1)) for d in i.shape)
            for i in inputs if i.shape is not None}


def _count_call_tir(func) -> list:
    import tvm
    from tvm import relax

    calls = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_tir":
            calls.append(e)

    relax.analysis.post_order_visit(func.body, visit)
    return calls


def _buffer_bytes(buf) -> float:
    import tvm

    n = 1
    for s in buf.shape:
        n *= int(s)
    dt = tvm.DataType(str(buf.dtype))
    return float(n * ((dt.bits * dt.lanes + 7) // 8))


def _is_float(dtype) -> bool:
    return str(dtype).startswith(("float", "bfloat"))


def analyze_module(fused_mod, ops_by_kernel: dict[str, list[str]]) -> list[KernelPlan]:
    """One KernelPlan per call_tir in `main` of a fused, legalized module."""
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    out = []
    for call in _count_call_tir(fused_mod["main"]):
        gv = call.args[0]
        func = fused_mod[gv]
        args = list(call.args[1].fields)
        params = list(func.params)  # TVM 0.27: PrimFunc params are the buffers themselves
        total = weight = floats = 0.0
        const_2d_float = 0
        in_dtypes = []
        for idx, buf in enumerate(params):
            b = _buffer_bytes(buf)
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
        flops = float(estimate_tir_flops(_tvm_mod_of(func, gv.name_hint)))
        is_mm = any(o.startswith("matmul") for o in ops)
        integer = is_mm and any(d.startswith(("int", "uint")) for d in in_dtypes)
        out.append(KernelPlan(gv.name_hint, ops, flops, total, weight, floats, integer,
                              is_mm and const_2d_float == 1 and not integer))
    return out


def _tvm_mod_of(func, name):
    import tvm

    return tvm.IRModule({name: func})


def _fused_ops(mod) -> dict[str, list[str]]:
    """Fused Relax function name -> the legalized ops it calls, in order (before FuseTIR)."""
    out = {}
    for gv, func in mod.functions.items():
        if func.attrs is not None and "Primitive" in func.attrs:
            out[gv.name_hint] = [c.args[0].name_hint for c in _count_call_tir(func)]
    return out


def make_plan(model, hw: HardwareTarget, precision: str = "auto", dims: dict[str, int] | None = None,
              shapes: dict[str, tuple[int, ...]] | None = None) -> Plan:
    """Plan the compilation of `model` (path or onnx.ModelProto) for `hw`.

    Args:
        model: the ONNX model.
        hw: the target.
        precision: "auto" or a precision from CHOICES.
        dims: values for symbolic dimensions (default 1 each).
        shapes: --shape overrides (take precedence over dims).

    Returns:
        The plan, with every kernel's verdict and every precision decision.

    Raises:
        TargetError: unknown precision, or the target lacks the figures a roofline needs.
    """
    import tvm

    from .. import pipeline
    from ..frontend.importer import import_onnx
    from ..frontend.onnx_model import load_onnx, resolve_input_shapes

    if precision not in CHOICES:
        raise TargetError(f"unknown precision '{precision}' (choose from {', '.join(CHOICES)})")
    dims = dict(dims or {})
    proto = load_onnx(model) if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__") else model
    infos = resolve_input_shapes(proto, dict(shapes or {}))
    used_dims = {d: int(dims.get(d, 1)) for i in infos for d in (i.shape or ()) if isinstance(d, str)}
    static = _static_shapes(infos, dims)
    static.update(shapes or {})
    try:
        # FLOPs need numbers: import with every symbolic dim bound.
        mod = import_onnx(proto, static).mod
    except TvmoptError:
        # Some graphs only import with symbolic dims: import as compile does, then bind them.
        from tvm import relax

        mod = import_onnx(proto, dict(shapes or {})).mod
        if used_dims:
            mod = relax.transform.BindSymbolicVars(used_dims, "main")(mod)

    target = hw.to_tvm()
    cfg = pipeline.PipelineConfig()
    with target:
        for name, make in pipeline.phases(hw.device):
            if name == "fuse":
                fuse = make(target, cfg)
                break
            mod = tvm.transform.Sequential(make(target, cfg))(mod)
        legal = tvm.transform.Sequential(fuse[:1])(mod)  # LegalizeOps only: kernels before fusion
        before = len(_count_call_tir(legal["main"]))
        pre_tir = tvm.transform.Sequential(fuse[:-1])(mod)
        ops = _fused_ops(pre_tir)
        fused = tvm.transform.Sequential(fuse[-1:])(pre_tir)
    kernels = analyze_module(fused, ops)
    for k in kernels:
        v = kernel_verdict(hw, k, "fp32")
        k.intensity, k.bound, k.fp32_time_us = v.intensity, v.bound, v.time_s * 1e6
    model_prec, decisions = decide(hw, kernels, precision)
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
                dims=used_dims, kernels_before_fusion=before, kernels=kernels, decisions=decisions,
                predicted_ms=total * 1e3, predicted_fp32_ms=sum(k.fp32_time_us for k in kernels) / 1e3,
                weight_bytes={"fp32": wb, "fp16": wb / 2, "int8_weight": wb - w8 * 3 / 4},
                ridge=ridge)
