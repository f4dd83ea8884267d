#!/usr/bin/env python3
"""Run `tvmopt compare` on every pair of a pairs.json and print one summary table (Markdown).

    python tools/make_variant_pairs.py /tmp/pairs
    python tools/compare_pairs.py /tmp/pairs/pairs.json /tmp/pairs/out --runtime both

Each pair runs in its own `tvmopt compare` process with default options (so tvmopt builds use
`--dispatch auto` and get oneDNN kernels where they win; JSON, report and plot in OUT_DIR); the
table shows, per runtime, the measured ratio, the share of B-A named causes explain, the largest
cause, and the top recommendation with its measured latency. The exit status is 1 when a pair
fails or a side's named causes explain under the share `compare` asks for (the sides are listed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

EXPLAINED_MIN = 0.8  # tvmopt.compare.attribution.EXPLAINED_MIN (this script runs without it)


def _rows(doc: dict) -> list[tuple[str, dict]]:
    return list(doc["runtimes"].items()) if "runtimes" in doc else [(doc["runtime"], doc)]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("pairs")
    ap.add_argument("out")
    ap.add_argument("--runtime", default="both")
    ap.add_argument("--target", default="x86")
    ap.add_argument("--no-run", action="store_true",
                    help="only rebuild the table from the JSON files already in OUT_DIR")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tvmopt = Path(sys.executable).with_name("tvmopt")
    lines = ["| A | B | runtime | A ms | B ms | B/A | named | largest cause (ms) | "
             "top recommendation | its measured ms | int8 folded to fp32, measured ms |",
             "|---|---|---|---:|---:|---:|---:|---|---|---:|---:|"]
    failed = 0
    short = []
    for pair in json.loads(Path(args.pairs).read_text()):
        a, b = Path(pair["a"]), Path(pair["b"])
        stem = f"{a.stem}-vs-{b.stem}"
        cmd = [str(tvmopt), "compare", str(a), str(b), "--runtime", args.runtime, "--target",
               args.target, "-o", str(out / stem), "--json", str(out / f"{stem}.json"),
               "--report", str(out / f"{stem}.md"), "--plot", str(out / f"{stem}.png"), "-q"]
        if args.no_run:
            res = subprocess.CompletedProcess(cmd, 0, "", "")
        else:
            print("$", " ".join(cmd), file=sys.stderr, flush=True)
            res = subprocess.run(cmd, capture_output=True, text=True)
            (out / f"{stem}.log").write_text(res.stdout + res.stderr)
        if res.returncode:
            failed += 1
            lines.append(f"| {a.name} | {b.name} | failed: {res.stderr.strip()[-200:]} |")
            continue
        doc = json.loads((out / f"{stem}.json").read_text())
        for rt, d in _rows(doc):
            top = max(d["attribution"], key=lambda r: abs(r["delta_ms"]))
            rec = d["recommendations"][0]
            got = "-" if rec["measured_ms"] is None else f"{rec['measured_ms']:.2f}"
            fold = next((r for r in d["recommendations"] if r["id"] == "fold_quantization"
                         and r["measured_ms"] is not None), None)
            folded = "-" if fold is None else f"{fold['measured_ms']:.2f}"
            if d["explained_share"] < EXPLAINED_MIN:
                who = ", ".join(f"{k['model'].upper()} {k['name']} {k['ms']:.2f} ms"
                                for k in d.get("unexplained_kernels", [])[:3])
                short.append(f"{a.name} vs {b.name} on {rt}: {d['explained_share']:.0%} "
                             f"({d['unexplained_ms']:+.2f} ms unexplained: {who or '-'})")
            lines.append(f"| {a.name} | {b.name} | {rt} | {d['a_ms']:.2f} | {d['b_ms']:.2f} | "
                         f"{d['ratio']:.2f}x | {d['explained_share']:.0%} | {top['label']} "
                         f"({top['delta_ms']:+.2f}) | {rec['action']} | {got} | {folded} |")
    if short:
        lines += ["", f"Under {EXPLAINED_MIN:.0%} of B-A explained:"] + [f"- {x}" for x in short]
    table = "\n".join(lines)
    (out / "summary.md").write_text(table + "\n")
    print(table)
    return 1 if failed or short else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
