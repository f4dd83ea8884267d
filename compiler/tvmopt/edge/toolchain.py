"""The C++ toolchain that links a bundle's library and runner, and the emulator that runs a foreign
architecture's binaries here, chosen from the cross toolchains in targets/cross.py."""

from __future__ import annotations

import os
import shutil

from ..errors import BuildError
from ..targets.cross import CROSS, Toolchain
from ..targets.registry import HardwareTarget, host_arch

# One line installs everything edge bundles need on a Debian/Ubuntu build machine.
SETUP_COMMAND = "apt-get install -y g++-aarch64-linux-gnu qemu-user"


def toolchain_for(arch: str) -> Toolchain:
    """The toolchain that builds for `arch` on this host.

    Raises:
        BuildError: no bundle support for `arch`.
    """
    if arch == host_arch():
        return Toolchain(arch, "g++", "g++")
    if arch not in CROSS:
        raise BuildError(f"edge bundles are built for {', '.join(sorted(CROSS))}; not {arch}")
    return CROSS[arch]


def bundle_toolchain(hw: HardwareTarget) -> Toolchain:
    """The toolchain for a bundle of `hw`, checked to be installed.

    Raises:
        BuildError: `hw` is not a CPU target, or its compiler is not installed (naming the
            package).
    """
    if hw.device != "cpu":
        raise BuildError(f"--bundle builds CPU bundles; target '{hw.name}' is {hw.device}")
    tc = toolchain_for(hw.arch)
    if shutil.which(tc.cxx) is None:
        raise BuildError(f"--bundle for target '{hw.name}' ({hw.arch}) needs {tc.cxx}, from the "
                         f"package {tc.package}: apt-get install -y {tc.package}"
                         + ("" if tc.cxx == "g++" else f" (edge set-up: {SETUP_COMMAND})"))
    return tc


def run_prefix(arch: str) -> list[str] | None:
    """The command prefix that runs an `arch` Linux binary here: [] natively, qemu-user for a
    foreign arch, None when this host cannot run it (no emulator or no cross runtime)."""
    if arch == host_arch():
        return []
    tc = CROSS.get(arch)
    if tc is None or shutil.which(tc.qemu) is None:
        return None
    if not os.path.isdir(tc.sysroot):
        return None
    return [tc.qemu, "-L", tc.sysroot]


def emulation_command(arch: str) -> str | None:
    """How an x86-64 (or other) Linux machine runs `arch` binaries under qemu-user, for docs;
    None for this host's own arch."""
    tc = CROSS.get(arch)
    if arch == host_arch() or tc is None:
        return None
    return f"{tc.qemu} -L {tc.sysroot}"


def missing_for_emulation(arch: str) -> str | None:
    """Why `arch` binaries cannot be run here (the packages to install), or None when they can."""
    if run_prefix(arch) is not None:
        return None
    tc = CROSS.get(arch)
    if tc is None:
        return f"no emulator known for {arch}"
    need = []
    if shutil.which(tc.qemu) is None:
        need.append(f"{tc.qemu} (package qemu-user)")
    if shutil.which(tc.cxx) is None:
        need.append(f"{tc.cxx} and its runtime {tc.sysroot} (package {tc.package})")
    return "needs " + " and ".join(need) + f"; edge set-up: {SETUP_COMMAND}"
