"""Cross compilers: the C++ compiler that links an artifact for a foreign-arch CPU target."""

from __future__ import annotations

import shutil

from ..errors import BuildError
from .registry import HardwareTarget, host_arch

_CROSS_CC = {"aarch64": "aarch64-linux-gnu-g++", "x86_64": "x86_64-linux-gnu-g++"}


def cross_cc(hw: HardwareTarget) -> str | None:
    """The C++ compiler that links a library for `hw`, or None for this host's own."""
    if hw.device != "cpu" or hw.arch == host_arch():
        return None
    cc = _CROSS_CC.get(hw.arch)
    if cc is None or shutil.which(cc) is None:
        raise BuildError(f"target '{hw.name}' is {hw.arch}; linking it here needs {cc or 'a cross compiler'} "
                         "(Debian: apt-get install g++-aarch64-linux-gnu); 'tvmopt plan' works without it")
    return cc
