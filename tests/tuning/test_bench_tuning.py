"""tools/bench_tuning.py's target check, on saved results (the run itself tunes for minutes)."""

from __future__ import annotations

import json
from pathlib import Path

from tools import bench_tuning

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _row(model, vs_untuned, vs_ort, spent=1.0, stopped_by="time"):
    return {"model": model, "batch": 1, "tuned_vs_untuned": vs_untuned,
            "ms": {"tvmopt-auto": {"p50": 1.0, "ratio_to_ort": vs_ort / vs_untuned},
                   "tvmopt-tuned": {"p50": vs_untuned, "ratio_to_ort": vs_ort}},
            "tuning": {"tasks": 3, "trials": 100, "spent": spent, "floor": 0.5,
                       "stopped_by": stopped_by}}


def _verdicts(rows):
    return [met for _, met, _ in bench_tuning.check(rows)]


def test_every_target_met():
    rows = [_row("a", 0.8, 0.7), _row("b", 0.85, 0.8), _row("c", 0.7, 0.6), _row("d", 1.0, 0.9)]
    assert _verdicts(rows) == [True, True, True, True]


def test_each_target_missed_on_its_own():
    base = [_row("a", 0.8, 0.7), _row("b", 0.85, 0.8), _row("c", 0.7, 0.6)]
    assert _verdicts(base + [_row("d", 1.01, 0.7)]) == [True, False, True, True]
    assert _verdicts([_row("a", 0.8, 0.7), _row("b", 0.9, 0.8), _row("c", 0.7, 0.6),
                      _row("d", 0.9, 0.7)]) == [False, True, True, True]
    assert _verdicts(base + [_row("d", 0.8, 1.5)]) == [True, True, False, True]
    assert _verdicts(base + [_row("d", 0.8, 0.7, spent=0.8)]) == [True, True, True, False]
    # every task's search ended before the budget: tune reported why, per task
    assert _verdicts(base + [_row("d", 0.8, 0.7, spent=0.4, stopped_by="exhausted")]) == [
        True, True, True, True]


def test_saved_twenty_minute_runs_are_read_and_checked():
    results = [json.loads((DOCS / f"bench-tuning-20min-zen4-{i}.json").read_text())
               for i in (1, 2)]
    rows = bench_tuning.tuned_rows(results)
    assert sorted(r["model"] for r in rows) == ["bert4l", "gpt2_4l", "mobilenetv2", "resnet18"]
    assert _verdicts(rows) == [False, True, True, True]
    text = bench_tuning.report(rows)
    assert "host: AMD EPYC" in text and "NOT MET tuned <= 0.85x untuned on 3 of 4: 0 of 4" in text
    assert "met     budget spent >= 90%, or the reason per task" in text
