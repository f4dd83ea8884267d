"""One fused kernel's figures (FLOPs, bytes, what kind of op it is) and the target's roofs.

What a kernel costs at a given precision is each precision scheme's own model
(`precision.schemes`, `kernel_cost` / `kernel_verdict`).""" 

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
