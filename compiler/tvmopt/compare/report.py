"""`compare` output: terminal tables, the JSON document, a Markdown report and a PNG."""

from __future__ import annotations

import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from ..console import console


def _sections(doc: dict) -> list[dict]:
    return list(doc["runtimes"].values()) if "runtimes" in doc else [doc]


def scale_warning(d: dict) -> str | None:
    """A line when the profiled runs and the timed runs disagree a lot (load changed)."""
    far = {k: v for k, v in d["profile_scale"].items() if not 0.5 <= v <= 2.0}
    if not far:
        return None
    parts = ", ".join(f"{k.upper()} x{v:.2f}" for k, v in far.items())
    return (f"the profiled runs and the timed runs disagree ({parts}): the machine's load changed "
            "between them, so the split follows the profile's mix at the timed size; rerun on "
            "a quieter machine for figures to keep")


def explanation_line(d: dict) -> str:
    """How much of B-A the named causes explain, said plainly when it is not enough: which
    kernels no cause covers and how many ms they hold."""
    from .attribution import EXPLAINED_MIN

    line = f"explained by named causes: {d['explained_share']:.0%} of B-A"
    noise = d.get("noise_ms")
    if noise is not None and abs(d["delta_ms"]) <= noise:
        line += (f" (B-A {d['delta_ms']:+.2f} ms is within the noise of +-{noise:.2f} ms, so "
                 "the share says little)")
    if d.get("explained_ok", d["explained_share"] >= EXPLAINED_MIN):
        return line
    ks = d.get("unexplained_kernels") or []
    which = ", ".join(f"{k['model'].upper()} {k['name']} {k['ms']:.2f} ms" for k in ks)
    return (f"{line}: NOT explained: {d['unexplained_ms']:+.2f} ms of B-A "
            f"({d['delta_ms']:+.2f} ms) sit in kernels no cause covers"
            + (f" ({which})" if which else "") + f"; under the {EXPLAINED_MIN:.0%} this "
            "report needs to be trusted")


def _sentence(line: str) -> str:
    return line[:1].upper() + line[1:]


def _where(k: dict) -> str:
    """A kernel's op family, and the graph node it ran for where the runtime names one."""
    op = f"`{k['op'][:40]}`"
    name = k["name"]
    if name == k["op"] or name.startswith(("fused_", "vm.", "(")) or name in k["op"]:
        return op
    return f"{op} ({name if len(name) <= 44 else '...' + name[-41:]})"


def _ms(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def print_compare(doc: dict) -> None:
    """Measured ratio, attribution table, recommendations and the verdict per runtime."""
    a, b = doc["a"], doc["b"]
    console.print(f"[bold]tvmopt compare[/] A={escape(a['label'])} ({a['precision']}) "
                  f"B={escape(b['label'])} ({b['precision']}) on {doc['target']}")
    for note in doc.get("refused", []):
        console.print(f"refused: {escape(note)}")
    for d in _sections(doc):
        noise = f" (noise +-{d['noise_ms']:.2f} ms)" if d.get("noise_ms") is not None else ""
        console.print(f"\n[bold]{d['runtime']}[/]: A {d['a_ms']:.2f} ms, B {d['b_ms']:.2f} ms, "
                      f"B/A {d['ratio']:.2f}x, B-A {d['delta_ms']:+.2f} ms{noise}")
        t = Table(show_edge=False)
        for col in ("cause", "A ms", "B ms", "delta ms", "share", "top kernels"):
            t.add_column(col, justify="left" if col in ("cause", "top kernels") else "right")
        for r in d["attribution"]:
            if abs(r["delta_ms"]) < 1e-3 and r["a_ms"] < 1e-3 and r["b_ms"] < 1e-3:
                continue
            top = ", ".join(f"{k['model'].upper()}:{k['op'][:28]} {k['ms']:.2f}"
                            for k in r["kernels"][:2])
            t.add_row(escape(r["label"]), _ms(r["a_ms"]), _ms(r["b_ms"]),
                      f"{r['delta_ms']:+.2f}", f"{r['share']:.0%}", escape(top))
        t.add_row("unexplained", "", "", f"{d['unexplained_ms']:+.2f}",
                  f"{d['unexplained_ms'] / d['delta_ms']:.0%}" if d["delta_ms"] else "-", "")
        console.print(t)
        line = explanation_line(d)
        console.print(escape(line) if "NOT explained" not in line
                      else f"[bold red]{escape(line)}[/]")
        warn = scale_warning(d)
        if warn:
            console.print(f"[yellow]warning:[/] {escape(warn)}")
        for i, r in enumerate(d["recommendations"], 1):
            console.print(f"  {i}. {escape(r['action'])}: predicted {_ms(r['predicted_ms'])} ms, "
                          f"measured {_ms(r['measured_ms'])} ms ({escape(r['why'])})")
        console.print(f"[bold]verdict ({d['runtime']}):[/] {escape(d['verdict'])}")
    if "runtimes" in doc:
        console.print(f"[bold]verdict:[/] {escape(doc['verdict'])}")


def write_json(doc: dict, path) -> None:
    Path(path).write_text(json.dumps(doc, indent=1, default=str) + "\n")


def write_markdown(docs: list[dict], path, command: str | None = None) -> None:
    """A self-contained report of one or more comparisons, with the command that made it."""
    head = ["```", command, "```", ""] if command else []
    Path(path).write_text("\n".join(head + [markdown(d) for d in docs]))


def markdown(doc: dict) -> str:
    """One comparison: measurements, attribution, recommendations, verdict."""
    a, b = doc["a"], doc["b"]
    lines = [f"# {a['label']} vs {b['label']} on {doc['target']}", ""]
    for note in doc.get("refused", []):
        lines += [f"- refused: {note}"]
    lines += [f"- A: `{a['path']}` ({a['precision']}, {a['flops'] / 1e6:.1f} MFLOP)",
              f"- B: `{b['path']}` ({b['precision']}, {b['flops'] / 1e6:.1f} MFLOP)",
              f"- host: {doc['host']['platform']}, {doc['host']['cpu_count']} CPUs, "
              f"{doc['threads']} threads per runtime; medians of {doc['runs']} interleaved runs",
              ""]
    for d in _sections(doc):
        lines += [f"## {d['runtime']}", "",
                  f"A {d['a_ms']:.2f} ms, B {d['b_ms']:.2f} ms: **B/A = {d['ratio']:.2f}x**, "
                  f"B-A = {d['delta_ms']:+.2f} ms"
                  + (f" (bootstrap 95% half-width {d['noise_ms']:.2f} ms)"
                     if d.get("noise_ms") is not None else "") + ".", "",
                  "| cause | A ms | B ms | B-A ms | share | largest kernels |",
                  "|---|---:|---:|---:|---:|---|"]
        for r in d["attribution"]:
            if max(abs(r["delta_ms"]), r["a_ms"], r["b_ms"]) < 1e-3:
                continue
            top = "; ".join(f"{k['model'].upper()} {_where(k)} {k['ms']:.2f} ms"
                            + (f" ({k['gbs']:.1f} GB/s)" if k.get("gbs") else "")
                            for k in r["kernels"][:3])
            lines.append(f"| {r['label']} | {r['a_ms']:.2f} | {r['b_ms']:.2f} | "
                         f"{r['delta_ms']:+.2f} | {r['share']:.0%} | {top} |")
        share = f"{d['unexplained_ms'] / d['delta_ms']:.0%}" if d["delta_ms"] else "-"
        lines += [f"| unexplained | | | {d['unexplained_ms']:+.2f} | {share} | "
                  + "; ".join(f"{k['model'].upper()} {_where(k)} {k['ms']:.2f} ms"
                              for k in d.get("unexplained_kernels", [])[:3]) + " |", "",
                  f"{_sentence(explanation_line(d))}. Kernel times come "
                  f"from each runtime's profiler, scaled to the measured medians (scale A "
                  f"{d['profile_scale']['a']:.2f}, B {d['profile_scale']['b']:.2f})."
                  + (f" Warning: {scale_warning(d)}." if scale_warning(d) else ""), "",
                  "| # | recommendation | predicted ms | measured ms | why |",
                  "|---|---|---:|---:|---|"]
        for i, r in enumerate(d["recommendations"], 1):
            lines.append(f"| {i} | {r['action']} | {_ms(r['predicted_ms'])} | "
                         f"{_ms(r['measured_ms'])} | {r['why']} |")
        lines += ["", f"**Verdict ({d['runtime']}):** {d['verdict']}", ""]
    if "runtimes" in doc:
        lines += [f"**Verdict:** {doc['verdict']}", ""]
    return "\n".join(lines)


def write_plot(docs: list[dict], path) -> None:
    """Per comparison and runtime: a waterfall from A's latency through each cause to B's, and
    A's and B's per-kernel profiles side by side (each kernel a segment, coloured by cause)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    secs = [(doc, d) for doc in docs for d in _sections(doc)]
    fig, axes = plt.subplots(len(secs), 2, figsize=(13, 4.6 * len(secs)), squeeze=False)
    causes = [r["cause"] for r in secs[0][1]["attribution"]] + ["other"]
    colors = {c: f"C{i}" for i, c in enumerate(causes)}
    for row, (doc, d) in zip(axes, secs):
        ax = row[0]
        level = d["a_ms"]
        labels, xs = ["A"], [0]
        ax.bar(0, level, color="0.6")
        steps = [(r["label"], r["delta_ms"], r["cause"]) for r in d["attribution"]
                 if abs(r["delta_ms"]) > 1e-3]
        steps.append(("unexplained", d["unexplained_ms"], "other"))
        top = max(d["a_ms"], d["b_ms"])
        for i, (label, delta, cause) in enumerate(steps, 1):
            ax.bar(i, delta, bottom=level, color=colors[cause])
            level += delta
            top = max(top, level, level - delta)
            labels.append(label)
            xs.append(i)
        ax.bar(len(steps) + 1, d["b_ms"], color="0.3")
        labels.append("B")
        xs.append(len(steps) + 1)
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
        ax.set_ylim(0, top * 1.08)
        ax.set_ylabel("ms per inference")
        ax.set_title(f"{d['runtime']}: A {d['a_ms']:.2f} ms -> B {d['b_ms']:.2f} ms "
                     f"({d['ratio']:.2f}x)", fontsize=9)
        ax = row[1]
        for j, side in enumerate(("a", "b")):
            scale = d["profile_scale"][side]
            bottom = 0.0
            # grouped by cause, largest kernels first inside a group: segments stay readable
            ks = sorted(d["profiles"][side], key=lambda k: (causes.index(k["cause"])
                                                             if k["cause"] in causes else 99,
                                                             -k["ms"]))
            for k in ks:
                h = k["ms"] * scale
                if h <= 0:
                    continue
                ax.bar(j, h, bottom=bottom, color=colors.get(k["cause"], "0.8"),
                       edgecolor="white", linewidth=0.3, label=k["cause"])
                bottom += h
        ax.set_xticks([0, 1])
        ax.set_xticklabels([f"A: {doc['a']['label']}", f"B: {doc['b']['label']}"], fontsize=8)
        ax.set_ylabel("profiled kernel ms (measured scale)")
        ax.set_title(f"{d['runtime']}: per-kernel profiles by cause", fontsize=9)
        handles, names = ax.get_legend_handles_labels()
        seen = dict(zip(names, handles))
        ax.legend(seen.values(), seen.keys(), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
