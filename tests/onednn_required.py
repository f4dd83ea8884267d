"""The oneDNN extension in tests: a required dependency on x86, absent hardware elsewhere.

`require_onednn()` is the one place a test asks for the extension. On an x86-64 host it builds
and loads it, and a build or load that fails fails the test: a broken extension must not pass
CI as a row of skips. On any other host the extension does not exist (oneDNN is x86-only), and
the test skips, naming the host's arch.
"""

from __future__ import annotations

import platform

import pytest

X86 = ("x86_64", "amd64")


def require_onednn():
    """tvmopt.library.onednn with its extension built and loaded; fails the calling test on
    an x86 host where that cannot be done, skips it on a host of another arch."""
    from tvmopt.library import onednn as od

    arch = platform.machine().lower()
    if arch not in X86:
        pytest.skip(f"oneDNN is x86-only; this host is {arch or 'of an unknown arch'}")
    try:
        od.load_extension()
    except Exception as err:  # noqa: BLE001 - any failure to build or load is the finding
        pytest.fail(f"oneDNN extension failed to build or load on this x86 host (a required "
                    f"dependency): {type(err).__name__}: {err}")
    return od
