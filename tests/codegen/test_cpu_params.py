"""The default schedules' CPU parameters come from the target's data (targets/*.toml).

The expected values are what the schedules used before they read the data (a table of CPU
names and fixed register counts), worked out by hand per preset: a new data source must not
move any existing target's register tile.
"""

from __future__ import annotations

import pytest

from tvmopt.codegen.cpu import CPUParams, register_tile
from tvmopt.targets.registry import get_target, load_targets, parse_target_file

# preset -> (vector bits, vector registers) the name table gave: haswell is AVX2 (16 YMM),
# cascadelake AVX-512 (32 ZMM), every aarch64 target NEON (32 V registers); the AVX-512
# presets added since (sapphirerapids, znver4) are on the same row as cascadelake.
BEFORE = {
    "x86-avx2": (256, 16),
    "x86-avx512": (512, 32),
    "x86-sapphirerapids": (512, 32),
    "x86-zen4": (512, 32),
    "arm-cortex-a55": (128, 32),
    "arm-cortex-a72": (128, 32),
    "arm-cortex-a76": (128, 32),
}


def test_every_cpu_preset_is_in_the_table():
    assert {t.name for t in load_targets().values() if t.device == "cpu"} == set(BEFORE)


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_presets_schedule_as_before(name):
    hw = get_target(name)
    params = CPUParams.from_hardware(hw)
    assert (params.vector_bits, params.num_vector_regs) == BEFORE[name]
    assert params.l1d_kb == hw.memory["l1d_kb"].value
    # A bare TVM target made from the preset (the trial builds') finds the same data.
    assert CPUParams.from_target(hw.to_tvm()) == params


def _as_host(monkeypatch, mcpu, flags):
    """Make detect_host() see a CPU LLVM calls `mcpu` with /proc/cpuinfo `flags`."""
    from tvm.target import codegen

    from tvmopt.codegen import cpu
    from tvmopt.targets import registry

    monkeypatch.setattr(codegen, "llvm_get_system_cpu", lambda: mcpu)
    monkeypatch.setattr(registry, "host_cpu_features", lambda: set(flags))
    monkeypatch.setattr(registry, "host_arch", lambda: "x86_64")
    monkeypatch.setattr(cpu, "_FROM_TARGET", {})
    return registry.detect_host()


@pytest.mark.parametrize("mcpu, flags, before", [
    # the name table: icelake-server/znver3 listed; skylake-avx512 matches the AVX2 preset
    # (no VNNI) yet has AVX-512, which its mcpu makes LLVM emit
    ("icelake-server", {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"},
     (512, 32)),
    ("znver3", {"avx2", "fma"}, (256, 16)),
    ("skylake-avx512", {"avx2", "fma", "avx512f", "avx512bw", "avx512vl"}, (512, 32)),
])
def test_host_schedules_as_before(monkeypatch, mcpu, flags, before):
    host = _as_host(monkeypatch, mcpu, flags)
    params = CPUParams.from_hardware(host)
    assert (params.vector_bits, params.num_vector_regs) == before
    assert CPUParams.from_target(host.to_tvm()) == params


def test_this_host_schedules_as_before():
    from tvm.target import Target, codegen

    from tvmopt.targets.registry import host_cpu_features

    host = get_target("host")
    params = CPUParams.from_hardware(host)
    mcpu = codegen.llvm_get_system_cpu()
    old_avx512 = {"skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
                  "icelake-server", "tigerlake", "rocketlake", "sapphirerapids", "emeraldrapids",
                  "graniterapids", "znver4", "znver5", "x86-64-v4"}
    old_avx2 = {"haswell", "broadwell", "skylake", "core-avx2", "alderlake", "raptorlake",
                "meteorlake", "znver1", "znver2", "znver3", "x86-64-v3"}
    if host.arch == "aarch64":
        before = (128, 32)
    elif mcpu in old_avx512:
        before = (512, 32)
    elif mcpu in old_avx2:
        before = (256, 16)
    else:
        pytest.skip(f"{mcpu}: the name table asked LLVM; nothing fixed to compare with")
    assert (params.vector_bits, params.num_vector_regs) == before
    if "avx512f" in host_cpu_features():
        assert params.vector_bits == 512
    assert CPUParams.from_target(Target(host.tvm_dict())) == params


def test_a_new_target_file_changes_the_register_tile(tmp_path):
    text = open(get_target("x86-avx2").path).read()
    assert "vector_registers = { value = 16," in text
    path = tmp_path / "x86-small.toml"
    path.write_text(text.replace('name = "x86-avx2"', 'name = "x86-small"')
                    .replace('aliases = ["x86"]', "aliases = []")
                    .replace("vector_registers = { value = 16,", "vector_registers = { value = 8,"))
    small = CPUParams.from_hardware(parse_target_file(path))
    preset = CPUParams.from_hardware(get_target("x86-avx2"))
    assert (small.vector_bits, small.num_vector_regs) == (256, 8)
    # A 32-lane-wide output (4 vectors) over rows of 8: 4 vectors x 2 rows fit in 16
    # registers (8 accumulators + 4 weight vectors + 1 broadcast), 2 x 2 in 8.
    assert register_tile(4, [8, 4, 2, 1], preset.num_vector_regs) == (4, 2)
    assert register_tile(4, [8, 4, 2, 1], small.num_vector_regs) == (2, 2)


def test_a_bare_target_falls_back_to_what_llvm_knows():
    from tvm.target import Target

    assert CPUParams.from_target(Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu",
                                         "mcpu": "skylake"})) == CPUParams(256, 16)
    assert CPUParams.from_target(Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu",
                                         "mcpu": "icelake-server"})) == CPUParams(512, 32)
    assert CPUParams.from_target(Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu",
                                         "mcpu": "cortex-a53"})) == CPUParams(128, 32)
