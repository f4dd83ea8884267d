"""What one fused kernel costs at each precision, under a target's roofline."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import TargetError
from ..targets.registry import HardwareTarget
from .roofline import Roof, Verdict, evaluate

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
    # Sizes known only at run time (counted as 1 in flops/bytes): the figures are not estimates
    # of this kernel's cost, just placeholders. "flops" here: TVM could not count its loops.
    unknown: list[str] = field(default_factory=list)

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
