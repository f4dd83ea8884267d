"""The dispatch timing cache forgets a timing once the code it measured has changed."""

from __future__ import annotations


def test_a_change_to_the_codegen_side_invalidates_cached_timings(monkeypatch):
    from tvmopt import timing

    before = timing.cache_key("workload", "target", "ext")
    assert timing.cache_key("workload", "target", "ext") == before  # stable within a version
    monkeypatch.setattr(timing, "codegen_id", lambda: "edited-default-schedules")
    assert timing.cache_key("workload", "target", "ext") != before
