"""`tvmopt demo` says when its latency table was timed on a busy machine."""

from __future__ import annotations


def test_a_busy_machine_is_named_under_the_latency_table(capsys):
    from tvmopt.cli.demo import _note_load

    _note_load([{"runtime": "tvmopt", "foreign_load": 1.4}])
    out = capsys.readouterr().out
    assert "other processes kept 1.4 cores busy" in out
    _note_load([{"runtime": "tvmopt", "foreign_load": 0.05}])
    assert capsys.readouterr().out == ""
