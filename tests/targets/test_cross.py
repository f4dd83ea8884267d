"""Artifact linking and edge bundles pick their cross compiler from the one table."""

import pytest

from tvmopt.edge.toolchain import toolchain_for
from tvmopt.errors import BuildError
from tvmopt.targets import cross
from tvmopt.targets.registry import get_target, host_arch


def test_bundles_use_the_cross_table():
    for arch, tc in cross.CROSS.items():
        if arch != host_arch():
            assert toolchain_for(arch) is tc


def test_a_missing_cross_compiler_names_it_and_its_package(monkeypatch):
    hw = get_target("arm-cortex-a76")
    if hw.arch == host_arch():
        pytest.skip("the arm target is this host's own arch")
    monkeypatch.setattr(cross.shutil, "which", lambda _: None)
    with pytest.raises(BuildError, match="aarch64-linux-gnu-g\\+\\+ .*apt-get install "
                                         "g\\+\\+-aarch64-linux-gnu"):
        cross.cross_cc(hw)
