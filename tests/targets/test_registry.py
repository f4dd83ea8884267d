"""The hardware database: every target loads, is sourced, and bad files are refused."""

import pytest

from tvmopt.errors import TargetError
from tvmopt.targets.registry import get_target, load_targets, parse_target_file

EXPECTED = {"a100", "h100", "h200", "x86-avx2", "x86-avx512", "arm-cortex-a76", "arm-cortex-a55",
            "arm-cortex-a72"}


def test_all_targets_present_with_aliases():
    assert EXPECTED <= set(load_targets())
    assert get_target("cuda").name == "a100"
    assert get_target("x86").name == "x86-avx2"
    assert get_target("arm").name == "arm-cortex-a76"
    assert get_target("h100").tvm["arch"] == get_target("h200").tvm["arch"] == "sm_90"
    assert get_target("a100").tvm["arch"] == "sm_80"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_number_is_sourced_and_roofline_ready(name):
    t = get_target(name)
    for table in (t.peak_gflops, t.memory, t.compute):
        for key, v in table.items():
            assert v.value > 0 and len(v.source) > 10 and v.unit, f"{name}: {key}"
    assert t.peak_gflops_total("fp32") and t.bandwidth_gbs()
    assert "fp32" in t.instructions


def test_fast_instructions_follow_the_isa():
    assert get_target("x86").fast_instructions("int8") == ()
    assert get_target("x86-avx512").fast_instructions("int8") == ("vpdpbusd",)
    assert "sdot" in get_target("arm").fast_instructions("int8")
    assert get_target("arm-cortex-a72").fast_instructions("int8") == ()
    assert get_target("h200").peak_gflops_total("fp8") > get_target("h200").peak_gflops_total("fp16")


def test_cpu_peaks_scale_with_reference_cores():
    t = get_target("arm")
    assert t.peak_gflops_total("fp32") == pytest.approx(t.peak_gflops["fp32"].value * 4)


def test_every_target_makes_a_tvm_target():
    for t in load_targets().values():
        assert t.to_tvm().kind.name == t.tvm["kind"]


def test_unknown_keys_rejected(tmp_path):
    p = tmp_path / "bad.toml"
    base = 'name = "bad"\ndescription = "x"\ndevice = "cpu"\narch = "x86_64"\n[tvm]\nkind = "llvm"\n'
    p.write_text(base + "[peak_gflops]\nfp33 = { value = 1, source = \"s\" }\n")
    with pytest.raises(TargetError, match="fp33"):
        parse_target_file(p)
    p.write_text(base + "[precision]\nauto_order = [\"fp12\"]\n")
    with pytest.raises(TargetError, match="fp12"):
        parse_target_file(p)
    p.write_text("colour = 1\n" + base)
    with pytest.raises(TargetError, match="colour"):
        parse_target_file(p)


def test_wider_preset_named_only_when_this_host_can_run_it(monkeypatch):
    from tvmopt.targets import registry

    monkeypatch.setattr(registry, "host_arch", lambda: "x86_64")
    avx512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512vnni"}
    monkeypatch.setattr(registry, "host_cpu_features", lambda: avx512)
    assert registry.wider_host_preset("x86").name == "x86-avx512"
    assert registry.wider_host_preset("x86-avx512") is None  # already the widest
    assert registry.wider_host_preset("cuda") is None and registry.wider_host_preset("arm") is None
    monkeypatch.setattr(registry, "host_cpu_features", lambda: {"avx2", "fma"})
    assert registry.wider_host_preset("x86") is None
    monkeypatch.setattr(registry, "host_cpu_features", lambda: avx512 - {"avx512vnni"})
    assert registry.wider_host_preset("x86") is None  # no entry fits that CPU exactly


def test_the_host_preset_is_the_widest_entry_this_cpu_runs(monkeypatch):
    """What `tvmopt demo` builds for by default, and whose committed database it looks for."""
    from tvmopt.targets import registry

    monkeypatch.setattr(registry, "host_arch", lambda: "x86_64")
    spr = set(registry.get_target("x86-sapphirerapids").features)
    monkeypatch.setattr(registry, "host_cpu_features", lambda: spr | {"sse4_2"})
    assert registry.host_preset().name == "x86-sapphirerapids"
    assert registry.detect_host().description.endswith("figures from 'x86-sapphirerapids'")
    monkeypatch.setattr(registry, "host_cpu_features", lambda: {"avx2", "fma", "sse4_2"})
    assert registry.host_preset().name == "x86-avx2"
    monkeypatch.setattr(registry, "host_cpu_features", lambda: {"sse4_2"})
    assert registry.host_preset() is None  # no entry: the demo builds for 'host'
    monkeypatch.setattr(registry, "host_arch", lambda: "riscv64")
    assert registry.host_preset() is None
