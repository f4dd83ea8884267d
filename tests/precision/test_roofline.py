"""Roofline arithmetic on hand-computed cases, and the precision rule built on it."""

import pytest

from tvmopt.precision.roofline import Roof, evaluate, intensity, matmul_cost
from tvmopt.precision.costs import KernelPlan
from tvmopt.precision.schemes import int8_weight_wins, kernel_cost
from tvmopt.precision.policy import decide
from tvmopt.targets.registry import get_target

ROOF = Roof(peak_gflops=100.0, bandwidth_gbs=10.0)  # ridge = 10 FLOP/B


def test_ridge():
    assert ROOF.ridge == 10.0


def test_gemv_is_memory_bound():
    flops, nbytes = matmul_cost(1, 1024, 1024)
    assert flops == 2 * 1024 * 1024 == 2_097_152
    assert nbytes == 4 * (1024 + 1024 * 1024 + 1024) == 4_202_496
    v = evaluate(flops, nbytes, ROOF)
    assert v.bound == "memory"
    assert v.intensity == pytest.approx(2_097_152 / 4_202_496)
    assert v.compute_s == pytest.approx(2_097_152 / 100e9)  # 20.97 us
    assert v.time_s == v.memory_s == pytest.approx(4_202_496 / 10e9)  # 420.25 us


def test_square_matmul_is_compute_bound():
    flops, nbytes = matmul_cost(512, 512, 512)
    assert (flops, nbytes) == (268_435_456, 3_145_728)
    v = evaluate(flops, nbytes, ROOF)
    assert v.bound == "compute" and v.intensity == pytest.approx(85.333, rel=1e-4)
    assert v.time_s == pytest.approx(2.68435456e-3)


def test_zero_bytes_and_bad_roof():
    assert intensity(10, 0) == float("inf")
    with pytest.raises(ValueError):
        evaluate(1, 1, Roof(0, 1))


def _gemv_kernel(m=1, k=1024, n=1024):
    flops, nbytes = matmul_cost(m, n, k)
    return KernelPlan("fused_matmul", ["matmul", "add"], flops, nbytes, 4.0 * k * n, nbytes,
                      False, True)


def test_int8_weight_cost_model():
    k = _gemv_kernel()
    flops, nbytes, dtype = kernel_cost(k, "int8_weight")
    assert flops == pytest.approx(1.5 * 2_097_152)  # dequantization inside the loop
    assert nbytes == pytest.approx(4_202_496 - 3 * 1024 * 1024)  # weights 4 -> 1 byte
    assert dtype == "fp32"
    assert kernel_cost(k, "fp16")[1] == pytest.approx(4_202_496 / 2)


def test_int8_weight_rule_on_arm():
    arm = get_target("arm")
    assert int8_weight_wins(arm, 1, 1024, 1024)  # GEMV: memory-bound, 4x fewer weight bytes
    assert not int8_weight_wins(arm, 512, 512, 512)  # compute-bound: dequant makes it slower


def test_auto_refuses_int8_without_fast_instructions():
    k = _gemv_kernel()
    k.integer_matmul, k.int8_weight_ok = True, False
    prec, decisions = decide(get_target("x86"), [k], "auto")
    assert prec == "fp32"
    assert decisions[0].action == "refused" and "VNNI" in decisions[0].reason
    prec, decisions = decide(get_target("x86-avx512"), [k], "auto")
    assert prec == "fp32" and "no schedule" in decisions[0].reason
    prec, decisions = decide(get_target("arm"), [k], "int8")  # has sdot, no path reaches it
    assert prec == "fp32" and decisions[0].action == "downgraded" and "sdot" in decisions[0].reason


def test_auto_on_cuda_picks_fp16_for_matmul_and_never_bf16():
    k = KernelPlan("fused_matmul", ["matmul"], *matmul_cost(512, 512, 512), 4.0 * 512 * 512,
                   3_145_728, False, True)
    prec, decisions = decide(get_target("cuda"), [k], "auto")
    assert prec == "fp16" and k.precision == "fp16"
    prec, decisions = decide(get_target("cuda"), [k], "bf16")
    assert prec == "fp32" and decisions[0].action == "downgraded"


def test_explicit_fp16_on_avx2_is_downgraded_not_silent():
    prec, decisions = decide(get_target("x86"), [_gemv_kernel()], "fp16")
    assert prec == "fp32"
    assert decisions[0].precision == "fp16" and decisions[0].action == "downgraded"
