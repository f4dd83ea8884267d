"""The compilation plan: per fused kernel, what it costs on a target and which precision it gets.

`make_plan` imports the model with static shapes (symbolic dims bound to `dims`, default 1), runs
tvmopt's own pipeline up to and including the `fuse` phase, and for every fused kernel (each
PrimFunc called from `main`) measures FLOPs (TVM's `estimate_tir_flops`) and compulsory bytes (its
buffers), then places it under the target's roofline (`precision.roofline`) for every precision the
target could use. The precision rule lives here, in one place:

    auto never picks a precision the target lacks fast instructions for, or one the plan predicts
    slower than fp32; every refusal or downgrade becomes a `Decision` that is printed and stored.

`compile` calls the same function, turns the plan into passes (`tvmopt.precision.rewrites`) and stores
`Plan.to_json()` in the manifest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import TvmoptError
from ..targets.registry import HardwareTarget
from .costs import KernelPlan, kernel_verdict, roof_for
from .policy import Decision, decide, parse

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

    parse(precision)
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
