"""The dispatch timing cache forgets a timing once the code it measured has changed."""

from __future__ import annotations


def test_a_change_to_the_codegen_side_invalidates_cached_timings(monkeypatch):
    from tvmopt.kernels import dispatch

    before = dispatch._cache_key("workload", "target", "ext")
    assert dispatch._cache_key("workload", "target", "ext") == before  # stable within a version
    monkeypatch.setattr(dispatch, "codegen_id", lambda: "edited-default-schedules")
    assert dispatch._cache_key("workload", "target", "ext") != before
