"""Hardware targets, read from the data files in targets/ (one TOML file per target).

This module does not import TVM, so `tvmopt targets` stays instant; `HardwareTarget.to_tvm()`
imports it on demand.
"""

from __future__ import annotations

import os
import platform
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .._data import data_dir
from ..errors import TargetError, error_line

# Keys a target file may have at top level; anything else is a typo and is rejected.
_TOP_KEYS = {
    "name", "aliases", "description", "device", "arch", "features", "tvm",
    "peak_gflops", "memory", "compute", "instructions", "precision", "notes",
}
_DEVICES = {"cpu", "cuda"}
# Dtypes a peak or instruction list may be given for; "int8" counts integer ops (GOP/s).
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp64")
# Precision schemes the planner knows (see tvmopt.precision.rewrites): int8_weight = weight-only int8.
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int8_weight")
_PRECISION_KEYS = {"auto_order", "int8_compute_path"}


@dataclass(frozen=True)
class Sourced:
    """A number together with where it comes from (datasheet, paper, measurement)."""

    value: float
    source: str
    unit: str = ""


@dataclass(frozen=True)
class HardwareTarget:
    """One entry of the hardware database.

    Attributes:
        name: canonical name, also the file stem.
        device: "cpu" or "cuda".
        arch: machine architecture the artifact runs on ("x86_64", "aarch64").
        features: ISA features a host must have to run code built for this target.
        tvm: the TVM target as a dict (TVM 0.27 refuses target strings).
        peak_gflops: peak throughput per dtype ("fp32", "fp16", "int8", ...).
        memory: memory-system figures (bandwidth_gbs, l1_kb, l2_kb, ...).
        compute: other compute figures (cores, sms, register file, ...).
        instructions: fast instructions by class (e.g. {"int8": ["vpdpbusd"]}).
        precision: per-target precision policy data, read by the precision planner.
    """

    name: str
    description: str
    device: str
    arch: str
    tvm: dict[str, Any]
    aliases: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    peak_gflops: dict[str, Sourced] = field(default_factory=dict)
    memory: dict[str, Sourced] = field(default_factory=dict)
    compute: dict[str, Sourced] = field(default_factory=dict)
    instructions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    precision: dict[str, Any] = field(default_factory=dict)
    notes: str = ""
    path: str = ""

    def tvm_dict(self) -> dict[str, Any]:
        """The TVM target dict, with `num-cores` filled in for CPU targets."""
        d = dict(self.tvm)
        if self.device == "cpu" and "num-cores" not in d:
            # built here to run here: this host's cores; cross-compiled: the reference machine's
            d["num-cores"] = (os.cpu_count() or 1) if self.arch == host_arch() else self.cores()
        return d

    def peak_gflops_total(self, dtype: str) -> float | None:
        """Peak GFLOP/s (GOP/s for int8) of the whole device for `dtype`, or None if not listed.

        CPU files give per-core peaks; they are multiplied by `compute.cores` (the reference
        machine's core count). GPU files give whole-device peaks.
        """
        p = self.peak_gflops.get(dtype)
        if p is None:
            return None
        if self.device == "cpu":
            return p.value * self.cores()
        return p.value

    def cores(self) -> int:
        """Core count of the reference machine (1 when the file does not say)."""
        c = self.compute.get("cores")
        return int(c.value) if c else 1

    def bandwidth_gbs(self) -> float | None:
        """Main-memory bandwidth in GB/s, or None when the file does not list it."""
        b = self.memory.get("bandwidth_gbs")
        return b.value if b else None

    def fast_instructions(self, dtype: str) -> tuple[str, ...]:
        """The target's fast arithmetic instructions for `dtype` (empty: none)."""
        return self.instructions.get(dtype, ())

    def to_tvm(self):
        """Return a `tvm.target.Target` for this entry."""
        import tvm

        try:
            return tvm.target.Target(self.tvm_dict())
        except Exception as err:  # TVM raises plain ValueError/TVMError on bad dicts
            raise TargetError(f"target '{self.name}' ({self.path}): TVM rejects {self.tvm_dict()}: "
                              f"{error_line(err)}") from None

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly view of the whole entry."""
        def sourced(d):
            return {k: {"value": v.value, "unit": v.unit, "source": v.source} for k, v in d.items()}

        return {
            "name": self.name, "aliases": list(self.aliases), "description": self.description,
            "device": self.device, "arch": self.arch, "features": list(self.features),
            "tvm": self.tvm, "peak_gflops": sourced(self.peak_gflops),
            "memory": sourced(self.memory), "compute": sourced(self.compute),
            "instructions": {k: list(v) for k, v in self.instructions.items()},
            "precision": self.precision, "notes": self.notes,
        }


def _sourced_table(path: Path, key: str, table: Any) -> dict[str, Sourced]:
    if not isinstance(table, dict):
        raise TargetError(f"{path}: [{key}] must be a table")
    out = {}
    for k, v in table.items():
        if not isinstance(v, dict) or "value" not in v or "source" not in v:
            raise TargetError(f"{path}: {key}.{k} must be {{ value = ..., source = \"...\" }}")
        extra = set(v) - {"value", "source", "unit"}
        if extra:
            raise TargetError(f"{path}: {key}.{k} has unknown keys {sorted(extra)}")
        if key == "peak_gflops" and k not in DTYPES:
            raise TargetError(f"{path}: peak_gflops.{k}: unknown dtype (known: {', '.join(DTYPES)})")
        out[k] = Sourced(float(v["value"]), str(v["source"]), str(v.get("unit", "")))
    return out


def _check_instructions(path: Path, table: Any) -> None:
    if not isinstance(table, dict):
        raise TargetError(f"{path}: [instructions] must be a table")
    for k, v in table.items():
        if k not in DTYPES:
            raise TargetError(f"{path}: instructions.{k}: unknown dtype (known: {', '.join(DTYPES)})")
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise TargetError(f"{path}: instructions.{k} must be a list of instruction names")


def _check_precision(path: Path, table: Any) -> None:
    if not isinstance(table, dict):
        raise TargetError(f"{path}: [precision] must be a table")
    unknown = set(table) - _PRECISION_KEYS
    if unknown:
        raise TargetError(f"{path}: precision has unknown keys {sorted(unknown)} "
                          f"(allowed: {sorted(_PRECISION_KEYS)})")
    bad = [p for p in table.get("auto_order", []) if p not in PRECISIONS]
    if bad:
        raise TargetError(f"{path}: precision.auto_order: unknown precisions {bad} "
                          f"(known: {', '.join(PRECISIONS)})")


def parse_target_file(path: Path) -> HardwareTarget:
    """Parse and validate one target file.

    Raises:
        TargetError: on a syntax error, unknown key or missing field.
    """
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise TargetError(f"{path}: cannot read target file: {err}") from None
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise TargetError(f"{path}: unknown keys {sorted(unknown)} (allowed: {sorted(_TOP_KEYS)})")
    for req in ("name", "description", "device", "arch", "tvm"):
        if req not in raw:
            raise TargetError(f"{path}: missing required key '{req}'")
    if raw["device"] not in _DEVICES:
        raise TargetError(f"{path}: device must be one of {sorted(_DEVICES)}")
    _check_instructions(path, raw.get("instructions", {}))
    _check_precision(path, raw.get("precision", {}))
    if raw["name"] != path.stem:
        raise TargetError(f"{path}: name '{raw['name']}' must match the file name")
    return HardwareTarget(
        name=raw["name"],
        description=raw["description"],
        device=raw["device"],
        arch=raw["arch"],
        tvm=dict(raw["tvm"]),
        aliases=tuple(raw.get("aliases", ())),
        features=tuple(raw.get("features", ())),
        peak_gflops=_sourced_table(path, "peak_gflops", raw.get("peak_gflops", {})),
        memory=_sourced_table(path, "memory", raw.get("memory", {})),
        compute=_sourced_table(path, "compute", raw.get("compute", {})),
        instructions={k: tuple(v) for k, v in raw.get("instructions", {}).items()},
        precision=dict(raw.get("precision", {})),
        notes=raw.get("notes", ""),
        path=str(path),
    )


@lru_cache(maxsize=None)
def load_targets(directory: str | None = None) -> dict[str, HardwareTarget]:
    """All targets in the database, by canonical name."""
    folder = Path(directory) if directory else data_dir("targets")
    targets = {}
    for path in sorted(folder.glob("*.toml")):
        t = parse_target_file(path)
        targets[t.name] = t
    return targets


def _alias_map(targets: dict[str, HardwareTarget]) -> dict[str, str]:
    names = {}
    for t in targets.values():
        for alias in t.aliases:
            if alias in names or alias in targets:
                raise TargetError(f"alias '{alias}' is defined twice ({t.path})")
            names[alias] = t.name
    return names


def valid_names() -> list[str]:
    """Target names and aliases a user may type, 'host' included."""
    targets = load_targets()
    return sorted(set(targets) | set(_alias_map(targets)) | {"host"})


def get_target(name: str) -> HardwareTarget:
    """Look a target up by name or alias; 'host' describes this machine.

    Raises:
        TargetError: naming the valid choices when `name` is unknown.
    """
    if name == "host":
        return detect_host()
    targets = load_targets()
    canonical = _alias_map(targets).get(name, name)
    if canonical not in targets:
        raise TargetError(f"unknown target '{name}'; valid targets: {', '.join(valid_names())}")
    return targets[canonical]


# ---------------------------------------------------------------------------------------------
# Host detection and compatibility

def host_arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def host_cpu_features() -> set[str]:
    """ISA feature flags of this CPU, as named by Linux in /proc/cpuinfo."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("flags", "features"):
                    flags.update(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    # aarch64 names: asimd = NEON, asimddp = dot product, fphp/asimdhp = fp16
    alias = {"asimd": "neon", "asimddp": "dotprod", "asimdhp": "fp16", "i8mm": "i8mm",
             "avx512_vnni": "avx512vnni", "avx_vnni": "avxvnni"}
    return flags | {alias[f] for f in flags if f in alias}


# Linux /proc/cpuinfo flag -> LLVM target feature, for the units that set which precisions
# run fast: bf16/int8 matrix (AMX) and dot-product (AVX512-BF16, VNNI) instructions and fp16.
MATRIX_FEATURES = {
    "amx_tile": "amx-tile", "amx_bf16": "amx-bf16", "amx_int8": "amx-int8",
    "avx512_bf16": "avx512bf16", "avx512_fp16": "avx512fp16", "avx512_vnni": "avx512vnni",
    "avx_vnni": "avxvnni",
}


def host_preset() -> HardwareTarget | None:
    """The database entry closest to this machine: same arch, every one of its features present
    here, the most features (None where no entry fits). Code built for it runs here, and a
    tuning database committed for it serves every machine of that kind."""
    arch = host_arch()
    feats = host_cpu_features()
    candidates = [t for t in load_targets().values()
                  if t.device == "cpu" and t.arch == arch and set(t.features) <= feats]
    return max(candidates, key=lambda t: len(t.features), default=None)


def detect_host() -> HardwareTarget:
    """Describe this machine as a target: the closest database entry, tuned to this CPU."""
    import tvm  # noqa: F401  (LLVM's host CPU name comes from TVM's LLVM)
    from tvm.target import codegen

    arch = host_arch()
    feats = host_cpu_features()
    base = host_preset()
    triple = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}.get(
        arch, codegen.llvm_get_system_triple())
    tvm_dict = {"kind": "llvm", "mtriple": triple, "mcpu": codegen.llvm_get_system_cpu(),
                "num-cores": os.cpu_count() or 1}
    # LLVM names the CPU from its model number, which a virtual machine may report for an older
    # part (a Sapphire Rapids guest reads as "rocketlake", without AMX or BF16): the feature
    # flags the kernel reports are what this CPU can run, so they are passed on as -mattr.
    matrix = sorted(f for f in MATRIX_FEATURES if f in feats)
    if matrix and arch == "x86_64":
        tvm_dict["mattr"] = [f"+{MATRIX_FEATURES[f]}" for f in matrix]
    wanted = tuple(dict.fromkeys([*(base.features if base else ()), *matrix]))
    compute = dict(base.compute) if base else {}
    # The base entry's peaks are per core; this machine's core count replaces the reference's.
    compute["cores"] = Sourced(float(tvm_dict["num-cores"]), "detected: os.cpu_count()", "cores")
    return HardwareTarget(
        name="host",
        description=f"this machine ({arch}, {tvm_dict['mcpu']}, {tvm_dict['num-cores']} cores)"
        + (f", figures from '{base.name}'" if base else ""),
        device="cpu", arch=arch, tvm=tvm_dict, features=tuple(wanted),
        peak_gflops=base.peak_gflops if base else {}, memory=base.memory if base else {},
        compute=compute, instructions=base.instructions if base else {},
        precision=base.precision if base else {}, path="<detected>",
    )


def wider_host_preset(name: str) -> HardwareTarget | None:
    """A database entry this host can run with more ISA features than target `name`, if any.

    A CPU target's code runs on any host with its features, so a portable preset ('x86' is
    AVX2) builds half-width vectors on an AVX-512 host, where onnxruntime and PyTorch pick
    AVX-512 kernels at run time: worth a note at compile time.
    """
    try:
        t = get_target(name)
    except TargetError:
        return None
    if t.device != "cpu" or t.arch != host_arch() or t.name == "host":
        return None
    feats = host_cpu_features()
    if not set(t.features) <= feats:
        return None
    wider = [c for c in load_targets().values()
             if c.device == "cpu" and c.arch == t.arch and set(t.features) < set(c.features)
             and set(c.features) <= feats]
    return max(wider, key=lambda c: len(c.features), default=None)


def check_host_can_run(device: str, arch: str, features: list[str] | tuple[str, ...]) -> None:
    """Raise TargetError unless this host can run code built for (device, arch, features)."""
    if device != "cpu":
        try:
            import tvm

            ok = tvm.device(device, 0).exist
        except (ImportError, ValueError, RuntimeError):
            # No TVM, a device name TVM does not know ("Unknown device": ValueError), or a
            # device runtime that fails to start (TVM's errors are RuntimeErrors): no device.
            ok = False
        if not ok:
            raise TargetError(f"artifact targets a {device} device, and this host has none",
                              hint="run it on a GPU machine, e.g. tools/gpu_check.py ARTIFACT MODEL"
                              if device == "cuda" else None)
        return
    here = host_arch()
    if arch != here:
        raise TargetError(f"artifact was built for {arch}; this host is {here}")
    missing = sorted(set(features) - host_cpu_features())
    if missing:
        raise TargetError(f"artifact needs CPU features {missing} that this host lacks")


def target_json(target) -> dict:
    """The full TVM target (every attribute, defaults included) as plain JSON."""
    import json

    return json.loads(str(target))
