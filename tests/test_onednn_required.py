"""tests/onednn_required.py: the oneDNN extension fails a test on x86 where it does not build
or load (a required dependency), and skips it only on a host of another arch."""

from __future__ import annotations

import platform

import pytest

from tests.onednn_required import require_onednn


def _broken(*args, **kwargs):
    raise RuntimeError("g++: fatal error: dnnl.hpp: No such file or directory")


def test_an_extension_that_does_not_build_fails_the_test_on_x86(monkeypatch):
    from tvmopt.library import onednn
    from tvmopt.library.onednn import extension

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(onednn, "load_extension", _broken)
    monkeypatch.setattr(extension, "load_extension", _broken)
    with pytest.raises(pytest.fail.Exception) as failed:
        require_onednn()
    assert "failed to build or load on this x86 host (a required dependency)" in str(failed.value)
    assert "dnnl.hpp: No such file or directory" in str(failed.value)


def test_a_host_of_another_arch_skips_and_names_it(monkeypatch):
    from tvmopt.library import onednn

    loaded = []
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(onednn, "load_extension", lambda *a, **k: loaded.append(1))
    with pytest.raises(pytest.skip.Exception, match="oneDNN is x86-only; this host is aarch64"):
        require_onednn()
    assert loaded == []  # nothing built where there is nothing to build


def test_an_extension_that_loads_is_returned(monkeypatch):
    from tvmopt.library import onednn

    monkeypatch.setattr(platform, "machine", lambda: "AMD64")
    monkeypatch.setattr(onednn, "load_extension", lambda *a, **k: None)
    assert require_onednn() is onednn
