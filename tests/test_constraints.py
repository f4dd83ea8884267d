"""The pinned versions: constraints.txt covers pyproject's dependencies and is what is installed."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")
Requirement = pytest.importorskip("packaging.requirements").Requirement


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            assert ver, f"constraints.txt: '{line}' is not an exact pin"
            pins[_norm(name)] = ver
    return pins


def _requirements() -> list:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + list(project["optional-dependencies"]["test"])
    reqs = [Requirement(r) for r in reqs]
    return [r for r in reqs if r.marker is None or r.marker.evaluate()]  # this platform's


def test_every_dependency_is_pinned_within_pyproject_bounds():
    pins = _pins()
    for req in _requirements():
        name = _norm(req.name)
        assert name in pins, f"{req.name} is not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"constraints.txt pins {req.name}=={pins[name]}, outside pyproject's '{req}'"


def test_installed_versions_are_the_pinned_ones():
    # A run on other versions is a run of something not verified: say which moved, so a failure
    # elsewhere in the suite is read with that in mind (reinstall with -c constraints.txt).
    pins, moved = _pins(), []
    for req in _requirements():
        try:
            have = version(req.name).split("+", 1)[0]
        except PackageNotFoundError:
            moved.append(f"{req.name} not installed")
            continue
        if have != pins[_norm(req.name)]:
            moved.append(f"{req.name} {have} (pinned {pins[_norm(req.name)]})")
    assert not moved, "installed versions differ from constraints.txt: " + ", ".join(moved)
