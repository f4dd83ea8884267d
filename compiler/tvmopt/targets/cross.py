"""Cross toolchains: the C++ compiler that links an artifact or edge bundle for a foreign-arch
CPU target, and the emulator that runs its binaries here; each named with its Debian package."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from ..errors import BuildError
from .registry import HardwareTarget, host_arch


@dataclass(frozen=True)
class Toolchain:
    """How to build and (here) run binaries for one CPU architecture."""

    arch: str
    cxx: str  # C++ compiler driver (also the linker of the model library)
    package: str  # Debian package providing `cxx`
    qemu: str | None = None  # user-mode emulator running this arch on a foreign host
    sysroot: str | None = None  # the cross C/C++ runtime the emulator loads (-L)


# Cross toolchains by target arch, as Debian names them; the host's own arch uses plain g++.
CROSS = {
    "aarch64": Toolchain("aarch64", "aarch64-linux-gnu-g++", "g++-aarch64-linux-gnu",
                         "qemu-aarch64", "/usr/aarch64-linux-gnu"),
    "x86_64": Toolchain("x86_64", "x86_64-linux-gnu-g++", "g++-x86-64-linux-gnu",
                        "qemu-x86_64", "/usr/x86-64-linux-gnu"),
}


def cross_cc(hw: HardwareTarget) -> str | None:
    """The C++ compiler that links a library for `hw`, or None for this host's own.

    Raises:
        BuildError: `hw` is a foreign arch whose cross compiler is unknown or not installed.
    """
    if hw.device != "cpu" or hw.arch == host_arch():
        return None
    tc = CROSS.get(hw.arch)
    if tc is None or shutil.which(tc.cxx) is None:
        need = tc.cxx if tc else "a cross compiler"
        package = tc.package if tc else "g++-aarch64-linux-gnu"
        raise BuildError(f"target '{hw.name}' is {hw.arch}; linking it here needs {need} "
                         f"(Debian: apt-get install {package}); 'tvmopt plan' works without it")
    return tc.cxx
