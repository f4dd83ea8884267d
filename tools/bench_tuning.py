#!/usr/bin/env python3
"""What tuning buys: each model tuned for N minutes as a user tunes it, then its build from that
database timed beside the untuned build, onnxruntime and OpenVINO, same run, each runtime in its
own process; and the tuning targets checked against the figures.

    python tools/bench_tuning.py                        # four models, 20 minutes each
    python tools/bench_tuning.py --models mobilenetv2 --minutes 5 --json /tmp/t.json
    python tools/bench_tuning.py --from docs/bench-tuning-20min-zen4-1.json \\
                                        docs/bench-tuning-20min-zen4-2.json

The run itself is `tools/bench_default.py --tune-minutes N` at batch 1 with the options `tvmopt
tune MODEL --minutes N --target host` uses by default (dispatch and precision "auto"): tune into
a fresh database, `compile --db` it, and time it against the untuned build in alternating
rounds. The models come from `tools/torch_models.py` (random weights, fixed seeds): a CNN, a
depthwise CNN, an encoder and a decoder, none of them bundled with tvmopt.

Then, per model: tuned / untuned latency, tuned / onnxruntime, the share of the budget spent,
the floor (oneDNN's calls, which tuning does not touch, put a bound on tuned / untuned that no
search can pass), and how near those calls run to oneDNN's rate on a large matmul on this host.
And the targets, each met or not, with the figures behind it:
  - tuned at most `FASTER` of the untuned latency on all but one model,
  - tuned never slower than untuned,
  - tuned at most `VS_ORT` of onnxruntime on the geometric mean,
  - at least `SPENT` of each run's budget spent, or every task's search ended early (tune
    then reports each task's reason).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_default  # noqa: E402 - a sibling script, found through HERE

MODELS = "resnet18,mobilenetv2,bert4l,gpt2_4l"
FASTER = 0.85  # tuned / untuned
VS_ORT = 0.8  # geometric mean of tuned / onnxruntime
SPENT = 0.9  # share of the budget a run spends


def _args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=MODELS, help="names from tools/torch_models.py")
    ap.add_argument("--minutes", type=float, default=20.0, help="tuning budget per model")
    ap.add_argument("--runs", type=int, default=40, help="timed calls per runtime")
    ap.add_argument("--baselines", default="onnxruntime,openvino")
    ap.add_argument("--out", default="/tmp/tvmopt-bench-tuning",
                    help="models, databases and artifacts go here")
    ap.add_argument("--json", dest="json_path", default=None,
                    help="write bench_default's results here (default: OUT/results.json)")
    ap.add_argument("--from", dest="from_json", nargs="+", default=None, metavar="JSON",
                    help="check the targets on saved results instead of running")
    return ap.parse_args(argv)


def tuned_rows(results: list[dict]) -> list[dict]:
    """The rows of saved bench_default results that have a tuned build, one per model."""
    rows = {}
    for res in results:
        for r in res["rows"]:
            if "tuned_vs_untuned" in r:
                rows[(r["model"], r["batch"])] = {**r, "host": res.get("host")}
    return list(rows.values())


def check(rows: list[dict]) -> list[tuple[str, bool, str]]:
    """Each target as (what it asks, met, the figures)."""
    if not rows:
        return []
    ratios = {r["model"]: r["tuned_vs_untuned"] for r in rows}
    faster = [m for m, x in ratios.items() if x <= FASTER]
    need = max(len(rows) - 1, 1)
    slower = [m for m, x in ratios.items() if x > 1.0]
    ort = [r["ms"]["tvmopt-tuned"]["ratio_to_ort"] for r in rows]
    geo = bench_default.geomean(ort)
    spent = {r["model"]: r["tuning"].get("spent") for r in rows}
    # A run whose every task's search ended early reports each task's reason: what the
    # target asks of a run that cannot spend its budget.
    ended = {r["model"] for r in rows if r["tuning"].get("stopped_by") == "exhausted"}
    short = [m for m, s in spent.items() if (s is None or s < SPENT) and m not in ended]
    return [
        (f"tuned <= {FASTER}x untuned on {need} of {len(rows)}", len(faster) >= need,
         f"{len(faster)} of {len(rows)}" + (f" ({', '.join(faster)})" if faster else "")),
        ("tuned never slower than untuned", not slower,
         "slower: " + ", ".join(f"{m} {ratios[m]:.2f}x" for m in slower) if slower
         else f"worst {max(ratios.values()):.2f}x"),
        (f"tuned <= {VS_ORT}x onnxruntime, geometric mean", geo <= VS_ORT, f"{geo:.2f}x"),
        (f"budget spent >= {SPENT:.0%}, or the reason per task", not short,
         ", ".join(f"{m} {'-' if s is None else f'{s:.0%}'}"
                   + (" (every task's search ended; reasons reported)" if m in ended else "")
                   for m, s in spent.items())),
    ]


def _rates(rows: list[dict]) -> str:
    """Each precision's probe rate over the runs, as a range where they differ."""
    seen: dict[str, list[float]] = {}
    for r in rows:
        for p, g in (r["tuning"].get("probe_gflops") or {}).items():
            seen.setdefault(p, []).append(g)
    return ", ".join(f"{p} {min(g):.0f}" + (f"-{max(g):.0f}" if max(g) - min(g) >= 0.5 else "")
                     + " GFLOP/s" for p, g in sorted(seen.items()))


def report(rows: list[dict]) -> str:
    lines = []
    hosts = {json.dumps(r["host"], sort_keys=True) for r in rows if r.get("host")}
    lines += [bench_default.host_line(json.loads(h)) for h in sorted(hosts)]
    lines.append("model        tasks trials spent  floor  oneDNN  untuned  tuned  tuned/untuned  "
                 "tuned/ort")
    for r in rows:
        t, ms = r["tuning"], r["ms"]
        untuned = next(k for k in ms if k.startswith("tvmopt-") and k != "tvmopt-tuned")
        floor = "-" if t.get("floor") is None else f"{t['floor']:.2f}x"
        spent = "-" if t.get("spent") is None else f"{t['spent']:.0%}"
        rate = "-" if t.get("library_of_probe") is None else f"{t['library_of_probe']:.0%}"
        lines.append(f"{r['model']:12s} {t['tasks']:5d} {t['trials']:6d} {spent:>5s} "
                     f"{floor:>6s} {rate:>6s} {ms[untuned]['p50']:8.3f} {ms['tvmopt-tuned']['p50']:6.3f} "
                     f"{r['tuned_vs_untuned']:13.2f}x {ms['tvmopt-tuned']['ratio_to_ort']:9.2f}x"
                     + (f"  ({t['build_failures']} failed builds)"
                        if t.get("build_failures") else "")
                     + (f"  (database served {t['hit_rate']:.0%} of the tuned build's tasks)"
                        if t.get("hit_rate") is not None and t["hit_rate"] < 1 else ""))
    for what, met, figures in check(rows):
        lines.append(f"{'met    ' if met else 'NOT MET'} {what}: {figures}")
    floors = [r["tuning"].get("floor") for r in rows]
    if any(f is not None and f > FASTER for f in floors):
        lines.append(f"(a floor above {FASTER}x: oneDNN's calls, untouched by tuning, hold "
                     "that share of the untuned kernel time)")
    if any(r["tuning"].get("library_of_probe") is not None for r in rows):
        lines.append("(oneDNN: its calls' time were they at the rate oneDNN reaches on a large "
                     "matmul on this host, as a share of their time as run; near 100%, no "
                     f"kernel could run them faster. Large matmul: {_rates(rows)})")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = _args(argv)
    if args.from_json:
        results = [json.loads(Path(p).read_text()) for p in args.from_json]
    else:
        out = Path(args.out)
        json_path = args.json_path or str(out / "results.json")
        rc = bench_default.main([
            "--models", args.models, "--batches", "1", "--dispatch", "auto",
            "--precision", "auto", "--tune-minutes", str(args.minutes), "--runs",
            str(args.runs), "--baselines", args.baselines, "--out", str(out),
            "--json", json_path])
        if rc:
            return rc
        results = [json.loads(Path(json_path).read_text())]
    rows = tuned_rows(results)
    if not rows:
        print("no tuned build in these results (bench_default.py --tune-minutes N makes them)")
        return 1
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
