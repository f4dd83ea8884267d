"""Bench output: rich tables, the JSON document, a flat CSV, and PNG plots."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from ..console import console, fitted_table

_STAT_COLS = ("min_ms", "mean_ms", "std_ms", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms",
              "max_ms")


def _mb(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MB"


def _ratio(r: dict, key: str) -> str:
    x = (r.get("ratio_to_ort") or {}).get(key)
    return "-" if x is None else f"{x:.2f}x"


def _dim_line(name: str, d: dict) -> str:
    if d["from"] == "--batch":
        return f"{name} = the batch size"
    why = {"--dim": "--dim", "bound": "the compiled lower bound",
           "default": f"default; set with --dim {name}=N"}[d["from"]]
    return escape(f"{name} = {d['value']} ({why})")


def print_bench(doc: dict) -> None:
    """Print every section present in a bench result document."""
    console.print(f"[bold]tvmopt bench[/] {escape(' '.join(doc['artifacts'].values()))}  "
                  f"(target {doc['target']}, {doc['device']}; threads: tvmopt "
                  f"{doc['host'].get('tvm_threads')}, baselines {doc['host']['threads']})")
    for name, st in doc.get("baselines", {}).items():
        console.print(f"  baseline {name}: {escape(st)}")
    if doc.get("dims"):
        console.print("  symbolic dims: " + "; ".join(_dim_line(k, v) for k, v in doc["dims"].items()))

    # two narrow tables rather than one that wraps in an 80-column terminal
    cols = [(c, "left" if c == "runner" else "right")
            for c in ("runner", "batch", "warm-up", "min", "mean", "P50", "P90", "P95", "P99",
                      "P99.9", "max")]
    rows = []
    for r in doc["closed_loop"]:
        s, w = r["steady"], r["warmup"]
        rows.append([r["runner"], str(r["batch"]), f"{w['mean_ms']:.2f}" if w else "-",
                     *[f"{s[k]:.2f}" for k in ("min_ms", "mean_ms", "p50_ms", "p90_ms",
                                                "p95_ms", "p99_ms", "p999_ms", "max_ms")]])
    console.print(fitted_table(cols, rows, ("P99.9", "P90", "warm-up", "min", "max"),
                               title="closed-loop latency, ms (warm-up excluded)"))
    cols = [(c, "left" if c == "runner" else "right")
            for c in ("runner", "batch", "n", "std ms", "CV", "samples/s", "mean/ort", "P50/ort",
                      "P99/ort", "samples/s/ort")]
    rows = []
    for r in doc["closed_loop"]:
        s = r["steady"]
        rows.append([r["runner"], str(r["batch"]), str(s["n"]), f"{s['std_ms']:.2f}",
                     ("[yellow]" if s["noisy"] else "") + f"{s['cv']:.1%}",
                     f"{s['throughput']:.1f}", _ratio(r, "mean_ms"), _ratio(r, "p50_ms"),
                     _ratio(r, "p99_ms"), _ratio(r, "throughput")])
    console.print(fitted_table(cols, rows, ("samples/s/ort", "P99/ort", "std ms", "n",
                                            "P50/ort"),
                               title="spread, throughput, ratio to onnxruntime (same batch, "
                                     "same run)"))
    if doc.get("profile"):
        p = doc["profile"]
        t = Table(title=f"per-kernel profile (batch {p['batch']}, top {len(p['kernels'])} of "
                        f"{p['kernel_count']} kernels, {p['total_ms_per_run']:.3f} ms/run "
                        "instrumented)", show_edge=False)
        for col in ("kernel", "calls/run", "mean us", "ms/run", "share"):
            t.add_column(col, justify="left" if col == "kernel" else "right")
        for k in p["kernels"]:
            t.add_row(escape(k["name"]), f"{k['calls_per_run']:g}", f"{k['mean_us']:.1f}",
                      f"{k['total_ms_per_run']:.3f}", f"{k['share']:.1%}")
        t.add_row("(other)", "", "", f"{p['other_ms_per_run']:.3f}",
                  f"{p['other_ms_per_run'] / p['total_ms_per_run']:.1%}" if p["total_ms_per_run"] else "-")
        console.print(t)

    if doc.get("load"):
        _print_load(doc["load"])
    if doc.get("soak"):
        _print_soak(doc["soak"])

    if doc.get("remote"):
        from .remote import describe

        for line in describe(doc["remote"]):
            console.print(escape(line))
    m = doc.get("memory")
    if m is None:
        console.print("memory, per-kernel profile, cold start: not measured on a remote device")
    else:
        console.print(f"memory: RSS {_mb(m['rss_start_bytes'])} at start, peak "
                      f"{_mb(m['rss_peak_bytes'])} during the bench (process lifetime peak "
                      f"{_mb(m['rss_lifetime_peak_bytes'])}); GPU "
                      f"{_mb(m['gpu_bytes']) if m['gpu_bytes'] is not None else m['gpu_note']}")
    c = doc.get("cold_start")
    if c:
        console.print(f"cold start (fresh process, batch {c['batch']}): load + first inference "
                      f"{c['load_plus_first_run_s'] * 1e3:.0f} ms (load {c['load_s'] * 1e3:.0f} ms,"
                      f" first run {c['first_run_s'] * 1e3:.1f} ms); imports "
                      f"{c['import_s'] * 1e3:.0f} ms; whole process {c['process_s']:.2f} s")
    for w in doc.get("warnings", []):
        console.print(f"[yellow]warning:[/] {escape(w)}")


def _print_load(ld: dict) -> None:
    s = ld["summary"]
    pol = ld["policy"]
    console.print(f"[bold]load test[/]: {ld['kind']} at {ld['rate']:g} req/s for {ld['duration_s']:g} s"
                  + (f" (burst {ld['burst']})" if ld.get("burst") else "")
                  + f"; sizes ({ld['size_dim']}): "
                  + ", ".join(f"{x['label']}={x['value']}:{x['prob']:.2f}" for x in ld["sizes"])
                  + f"; max batch {pol['max_batch']}, max wait {pol['max_wait_s'] * 1e3:g} ms, "
                  + (f"timeout {pol['timeout_s'] * 1e3:g} ms, " if pol["timeout_s"] else "no timeout, ")
                  + f"queue {pol['max_queue']}")
    cols = [(c, "right") for c in ("requests", "completed", "dropped", "timed out", "offered/s",
                                    "achieved/s", "items/s", "utilization", "batches",
                                    "mean batch")]
    row = [str(s["requests"]), str(s["completed"]), str(s["dropped"]), str(s["timed_out"]),
           f"{s['offered_rate']:.1f}", f"{s['achieved_rate']:.1f}",
           f"{s['achieved_items_per_s']:.1f}", f"{s['utilization']:.0%}", str(s["batches"]),
           f"{s['mean_batch_items']:.2f}"]
    console.print(fitted_table(cols, [row], ("items/s", "batches", "mean batch", "timed out",
                                             "utilization")))
    if s.get("failed"):
        console.print(f"failed: {s['failed']} request(s) the artifact refused; the server went on")
        for msg, n in (s.get("errors") or {}).items():
            console.print(f"  {n}x {msg}")
    if s["latency"]:
        cols = [(c, "right") for c in ("", "min", "mean", "P50", "P90", "P95", "P99", "P99.9",
                                       "max")]
        rows = [[name, *[f"{st[k]:.2f}" for k in ("min_ms", "mean_ms", "p50_ms", "p90_ms",
                                                   "p95_ms", "p99_ms", "p999_ms", "max_ms")]]
                for name, st in (("end-to-end", s["latency"]), ("queue wait", s["queue_wait"]))]
        for label, b in s["by_size"].items():
            rows.append([f"size {escape(label)} ({b['completed']})", "", "", f"{b['p50_ms']:.2f}",
                         "", "", f"{b['p99_ms']:.2f}", "", ""])
        console.print(fitted_table(cols, rows, ("P99.9", "P90", "min"),
                                   title="end-to-end latency (queueing + compute), ms"))
    g = s["queueing_growth"]
    if g["first_third_mean_ms"] is not None:
        console.print(f"  latency first third {g['first_third_mean_ms']:.1f} ms -> last third "
                      f"{g['last_third_mean_ms']:.1f} ms (slope {g['slope_ms_per_s']:.1f} ms/s)"
                      + ("  [red]queue growing[/]" if g["growing"] else "  not growing"))
    console.print(f"  max queue depth {s['max_queue_depth']}; "
                  + ("[red]over capacity[/] (growing queue, losses, or served < 90% of offered)"
                     if s["overloaded"] else "[green]keeping up[/] with the offered load"))
    console.print("  batch-size histogram (items: batches): "
                  + ", ".join(f"{k}: {v}" for k, v in s["batch_histogram"].items()))


def _print_soak(sk: dict) -> None:
    t = Table(title=f"soak: batch {sk['batch']}, {sk['duration_s']:g} s, {sk['calls']} calls",
              show_edge=False)
    for col in ("window", "t (s)", "calls", "P50 ms", "P99 ms", "RSS"):
        t.add_column(col, justify="right")
    for w in sk["windows"]:
        t.add_row(str(w["window"]), f"{w['t_s']:.1f}", str(w["calls"]), f"{w['p50_ms']:.3f}",
                  f"{w['p99_ms']:.3f}", _mb(w["rss_bytes"]))
    console.print(t)
    console.print(f"  P50 drift {sk['p50_drift']:+.1%}, RSS growth {sk['rss_growth']:+.2%} "
                  f"({sk['rss_slope_bytes_per_min'] / 2**20:+.2f} MB/min): "
                  + ("[red]leak suspected[/]" if sk["leak_suspected"] else "no leak"))


# ------------------------------------------------------------------------------------ files
def _clean(x):
    """NaN/inf -> None, so the file is strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(doc: dict, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(_clean(doc), indent=1, allow_nan=False))


def csv_rows(doc: dict) -> list[dict]:
    """One row per (section, runner, batch, metric): easy to filter and pivot."""
    rows = []
    for r in doc["closed_loop"]:
        for k, v in r["steady"].items():
            rows.append({"section": "closed_loop", "runner": r["runner"], "batch": r["batch"],
                         "metric": k, "value": v,
                         "ratio_to_ort": (r.get("ratio_to_ort") or {}).get(k, "")})
        if r["warmup"]:
            rows.append({"section": "warmup", "runner": r["runner"], "batch": r["batch"],
                         "metric": "mean_ms", "value": r["warmup"]["mean_ms"], "ratio_to_ort": ""})
    if doc.get("load"):
        s = doc["load"]["summary"]
        for k, v in s.items():
            if isinstance(v, (int, float)):
                rows.append({"section": "load", "runner": "tvmopt", "batch": "", "metric": k,
                             "value": v, "ratio_to_ort": ""})
        for k, v in (s["latency"] or {}).items():
            rows.append({"section": "load_latency", "runner": "tvmopt", "batch": "",
                         "metric": k, "value": v, "ratio_to_ort": ""})
    for k in (doc.get("profile") or {}).get("kernels", []):
        rows.append({"section": "profile", "runner": "tvmopt", "batch": doc["profile"]["batch"],
                     "metric": k["name"], "value": k["total_ms_per_run"], "ratio_to_ort": ""})
    for k, v in (doc.get("cold_start") or {}).items():
        rows.append({"section": "cold_start", "runner": "tvmopt", "batch": "", "metric": k,
                     "value": v, "ratio_to_ort": ""})
    for k, v in (doc.get("memory") or {}).items():
        if isinstance(v, (int, float)):
            rows.append({"section": "memory", "runner": "tvmopt", "batch": "", "metric": k,
                         "value": v, "ratio_to_ort": ""})
    return rows


def write_csv(doc: dict, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["section", "runner", "batch", "metric", "value",
                                          "ratio_to_ort"])
        w.writeheader()
        w.writerows(csv_rows(doc))


def _log_if_wide(ax, axis: str, values) -> None:
    """Log scale only when the data spans more than a decade: inside one decade a log axis
    has no major tick to label, and minor labels collide."""
    v = [x for x in values if x and x > 0]
    if v and max(v) / min(v) > 10:
        from matplotlib.ticker import NullFormatter

        getattr(ax, f"set_{axis}scale")("log")
        getattr(ax, f"{axis}axis").set_minor_formatter(NullFormatter())


def write_plot(doc: dict, path) -> None:
    """Latency CDF per runner and batch; throughput vs latency over the batch sweep; load-test
    latency over time (with the batch sizes formed), or the soak windows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    sweep = len({r["batch"] for r in doc["closed_loop"]}) > 1  # one point is not a curve
    panels = ["cdf"] + (["sweep"] if sweep else []) + (["load"] if doc.get("load") else []) + \
             (["soak"] if doc.get("soak") else [])
    cols = 2 if len(panels) == 4 else len(panels)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.8 * cols, 4.3 * rows))
    axes = np.atleast_1d(axes).reshape(-1)
    for ax, panel in zip(axes, panels):
        if panel == "cdf":
            # colour = runner, line style = batch: 4 runners x 3 batches stay distinguishable
            names = list(dict.fromkeys(r["runner"] for r in doc["closed_loop"]))
            batches = list(dict.fromkeys(r["batch"] for r in doc["closed_loop"]))
            styles = ["-", "--", ":", "-."]
            for r in doc["closed_loop"]:
                x = np.sort(r["samples_ms"])
                ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post",
                        color=f"C{names.index(r['runner']) % 10}",
                        ls=styles[batches.index(r["batch"]) % len(styles)],
                        label=f"{r['runner']} b{r['batch']}")
            _log_if_wide(ax, "x", [v for r in doc["closed_loop"] for v in r["samples_ms"]])
            ax.set_xlabel("latency per call (ms)")
            ax.set_ylabel("fraction of calls")
            ax.set_title("closed-loop latency CDF")
            ax.legend(fontsize=7)
        elif panel == "sweep":
            names = list(dict.fromkeys(r["runner"] for r in doc["closed_loop"]))
            for i, name in enumerate(names):
                rs = [r for r in doc["closed_loop"] if r["runner"] == name]
                xs = [r["steady"]["p50_ms"] for r in rs]
                ys = [r["steady"]["throughput"] for r in rs]
                ax.plot(xs, ys, marker="o", color=f"C{i % 10}", label=name)
                for r, x, y in zip(rs, xs, ys):
                    ax.annotate(f"b{r['batch']}", (x, y), fontsize=7, xytext=(3, 3),
                                textcoords="offset points")
            _log_if_wide(ax, "x", [r["steady"]["p50_ms"] for r in doc["closed_loop"]])
            _log_if_wide(ax, "y", [r["steady"]["throughput"] for r in doc["closed_loop"]])
            ax.set_xlabel("P50 latency per batch (ms)")
            ax.set_ylabel("throughput (samples/s)")
            ax.set_title("throughput vs latency (batch sweep)")
            ax.legend(fontsize=7)
        elif panel == "load":
            ld = doc["load"]
            tl = ld["timeline"]
            a = np.array(tl["arrival_s"])
            lat = np.array([np.nan if v is None else v for v in tl["latency_ms"]], dtype=float)
            ok = np.array([s == "ok" for s in tl["status"]])
            ax.scatter(a[ok], lat[ok], s=4, label="completed")
            bad = ~ok
            if bad.any():
                top = np.nanmax(lat) if np.isfinite(lat).any() else 1.0
                ax.scatter(a[bad], np.full(bad.sum(), top), s=6, marker="x", color="red",
                           label="dropped / timed out")
            t0 = 0.0
            for k, (secs, rate) in enumerate(ld.get("phases") or []):
                if len(ld["phases"]) > 1:  # shade burst phases, labelled with their rate
                    ax.axvspan(t0, t0 + secs, color="orange", alpha=0.06 + 0.08 * (k % 2), lw=0)
                    ax.text(t0 + secs / 2, 0.02, f"{rate:g}/s", transform=ax.get_xaxis_transform(),
                            ha="center", va="bottom", fontsize=8, color="darkorange")
                t0 += secs
            ax.set_xlabel("arrival time (s)")
            ax.set_ylabel("end-to-end latency (ms)")
            ax.set_title(f"load: {ld['kind']} {ld['rate']:g}/s, max batch {ld['policy']['max_batch']}")
            ax2 = ax.twinx()
            d = np.array(tl.get("queue_depth") or [[0, 0]], dtype=float)
            ax2.step(d[:, 0], d[:, 1], where="post", color="gray", alpha=0.6, lw=0.8)
            ax2.set_ylabel("queued requests", color="gray")
            ax.legend(fontsize=7, loc="upper left")
        elif panel == "soak":
            sk = doc["soak"]
            t = [w["t_s"] for w in sk["windows"]]
            ax.plot(t, [w["p50_ms"] for w in sk["windows"]], marker="o", label="P50")
            ax.plot(t, [w["p99_ms"] for w in sk["windows"]], marker="o", label="P99")
            ax.set_xlabel("time (s)")
            ax.set_ylabel("latency (ms)")
            ax.set_title("soak")
            ax2 = ax.twinx()
            ax2.plot(t, [w["rss_bytes"] / 2**20 for w in sk["windows"]], color="gray", ls="--")
            ax2.ticklabel_format(axis="y", useOffset=False)  # absolute MB, not "+8.01e2"
            mb = [w["rss_bytes"] / 2**20 for w in sk["windows"]]
            # at least +-2% around the data, so kilobytes of jitter do not look like a leak
            ax2.set_ylim(min(min(mb), np.mean(mb) * 0.98), max(max(mb), np.mean(mb) * 1.02))
            ax2.set_ylabel("RSS (MB)", color="gray")
            ax.legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
