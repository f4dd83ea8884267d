"""Human-readable output for the CLI (rich tables). The API returns data; this prints it."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from .console import console, fitted_table
from .fallbacks import counts
from .targets.registry import wider_host_preset


def _si(n: float, unit: str = "") -> str:
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}{unit}"
    return f"{n:g} {unit}".strip()


def _sig(infos) -> str:
    return escape(", ".join(f"{i.name}: {i.dtype}[{i.shape_str()}]" for i in infos))


def print_model_info(info) -> None:
    kind = (f"opset {info.opset}, IR v{info.ir_version}" if info.format == "onnx"
            else info.format)
    console.print(f"[bold]{escape(info.path)}[/]  {kind}"
                  + (f", from {escape(info.producer)}" if info.producer else ""))
    console.print(f"  inputs:  {_sig(info.inputs)}")
    console.print(f"  outputs: {_sig(info.outputs)}")
    console.print(f"  nodes: {info.node_count}   parameters: {_si(info.parameter_count)} "
                  f"({_si(info.parameter_bytes, 'B')})   FLOPs: {_si(info.flops)} ({info.flops_note})")
    t = Table(title="op types", show_edge=False)
    t.add_column("op")
    t.add_column("count", justify="right")
    for op, n in info.op_histogram.items():
        t.add_row(op, str(n))
    console.print(t)
    for w in info.nonfinite_weights:
        console.print(f"[yellow]warning:[/] {escape(w)}")
    if info.opset_refusal:
        console.print(f"[red]refused:[/] {info.opset_refusal}")
    if info.unsupported:
        console.print("[red]unsupported by the importer:[/]")
        for op, nodes in info.unsupported.items():
            console.print(f"  {op}: {', '.join(nodes[:5])}" + (" ..." if len(nodes) > 5 else ""))
    else:
        console.print("importer: every op type has a converter")


def print_compile_result(result, shown_path: str | None = None) -> None:
    art = result.artifact
    m = art.manifest
    t = m["target"]
    console.print(f"[green]compiled[/] {m['model']['file']} -> {shown_path or art.path}  "
                  f"(target {t['name']}: {t['tvm'].get('kind')} {t['tvm'].get('mcpu', t['tvm'].get('arch', ''))})")
    console.print(f"  inputs:  {_sig(art.inputs)}")
    console.print(f"  outputs: {_sig(art.outputs)}")
    tm = result.timings
    console.print("  time: " + ", ".join(f"{k[:-2]} {v:.2f}s" for k, v in tm.items()))
    prec = m.get("precision") or {}
    if prec.get("requested"):
        console.print(f"  precision: {prec.get('default')} (requested {prec['requested']}; "
                      "'tvmopt plan' shows the per-kernel reasons)")
    gate = prec.get("gate")
    if gate:
        last = gate["attempts"][-1] if gate["attempts"] else None
        measured = (f"error {last['error']:.3g} vs {gate['reference']}" if last else "")
        console.print(f"  accuracy gate ({gate['precision']}): {gate['result']}; {measured}, "
                      f"limit {gate['limit']:g} ({gate['limit_from']}; max|out - ref| / "
                      f"max|ref|), {len(gate['attempts'])} attempt(s)")
    kernels = m.get("kernels") or {}
    if kernels:
        choices = kernels.get("choices") or []
        lib = sum(c["sites"] for c in choices if c["choice"] == "library")
        lib8 = sum(c["sites"] for c in choices
                   if c["choice"] == "library" and c.get("precision") == "int8")
        on = f"{lib} kernels on oneDNN" + (f" ({lib8} int8)" if lib8 else "")
        what = {"untuned": "default schedules, untuned (no database)",
                "dispatched": f"{on}, the rest default schedules",
                "tuned": "tuned records where the database has them, default schedules "
                         "elsewhere"}.get(kernels.get("build"), kernels.get("build"))
        console.print(f"  kernels: {what} (--dispatch {kernels.get('dispatch')}, layout "
                      f"{kernels.get('layout')})")
        for note in kernels.get("notes") or []:
            console.print(f"  note: {note}")
    if "fallbacks" in m:  # artifacts from before the record have no count to show
        console.print(f"  fallbacks: {fallback_summary(m['fallbacks'])}")
    wider = wider_host_preset(t["name"])
    if wider is not None:
        extra = ", ".join(sorted(set(wider.features) - set(t.get("features") or ())))
        console.print(f"  note: this host also has {extra}; '--target host' (or {wider.name}) "
                      f"uses them; '{t['name']}' stays portable")
    plan = m.get("plan") or {}
    if plan.get("predicted_ms") is not None:
        # the roofline's figure is a floor: real kernels reach a fraction of peak
        bound = " (a lower bound: some sizes are known only at run time)" \
            if plan.get("unestimated_kernels") else ""
        console.print(f"  expected latency: >= {plan['predicted_ms']:.3f} ms by the plan's roofline "
                      f"(no launch or framework overhead){bound}; 'tvmopt bench' measures it")
    tuning = m.get("tuning") or {}
    if tuning.get("database"):
        console.print(f"  tuning db: {tuning['database']} (hit rate {tuning.get('hit_rate', 0):.0%})")
    if result.verification is not None:
        ref = "torch" if m["model"].get("format") == "torch.export" else "onnxruntime"
        for e in result.verification:
            console.print(f"  verify {escape(e.name)}: max abs err {e.max_abs:.2e}, max rel err "
                          f"{e.max_rel:.2e} vs {ref} [green]ok[/]")


def fallback_summary(records: list[dict]) -> str:
    """'none', or the count by kind: what compile's summary says about the manifest's list."""
    if not records:
        return "none"
    by_kind = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in counts(records).items())
    return f"{len(records)} ({by_kind}); the manifest's 'fallbacks' names each"


def print_outputs(outs: dict, path: str | None) -> None:
    for name, arr in outs.items():
        flat = arr.reshape(-1)
        preview = ", ".join(f"{v:.4g}" if arr.dtype.kind == "f" else str(v) for v in flat[:6])
        console.print(escape(f"{name}: {arr.dtype}[{'x'.join(map(str, arr.shape)) or 'scalar'}]  "
                             f"[{preview}{', ...' if flat.size > 6 else ''}]"))
    if path:
        console.print(f"wrote {path}")


def print_latency_summary(rows: list[dict]) -> None:
    t = Table(title="latency (batch as compiled, same inputs, same run)", show_edge=False)
    for col in ("runtime", "median ms", "p95 ms", "vs onnxruntime"):
        t.add_column(col, justify="right" if col != "runtime" else "left")
    for r in rows:
        t.add_row(r["runtime"], f"{r['median_ms']:.3f}", f"{r['p95_ms']:.3f}",
                  f"{r['ratio_to_ort']:.2f}x" if r.get("ratio_to_ort") else "-")
    console.print(t)


def _peak_cell(t, dtype: str) -> str:
    v = t.peak_gflops_total(dtype)
    return "-" if v is None else _si(v * 1e9)


def print_targets(targets) -> None:
    cols = [(c, "left") for c in ("name", "aliases", "device", "arch", "fp32 FLOP/s", "fp16",
                                   "bf16", "int8 OP/s", "fp8", "mem GB/s", "fast int8 instr")]
    rows = []
    for x in targets:
        bw = x.bandwidth_gbs()
        rows.append([x.name, ", ".join(x.aliases), x.device, x.arch,
                     *(_peak_cell(x, d) for d in ("fp32", "fp16", "bf16", "int8", "fp8")),
                     f"{bw:g}" if bw else "-", (x.fast_instructions("int8") or ("-",))[0]])
    rows.append(["host", "", "cpu", "(detected)", "", "", "", "", "", "", ""])
    console.print(fitted_table(cols, rows, ("fp8", "fast int8 instr", "aliases", "bf16"),
                               title="peaks are whole-device (CPU: per-core peak x reference "
                                     "cores)"))


def print_target(t) -> None:
    console.print(f"[bold]{t.name}[/] ({', '.join(t.aliases) or 'no aliases'}): {t.description}")
    console.print(f"  device {t.device}, arch {t.arch}, features {', '.join(t.features) or '-'}")
    console.print(f"  tvm target: {t.tvm_dict()}")
    for title, table in (("peak", t.peak_gflops), ("memory", t.memory), ("compute", t.compute)):
        for k, v in table.items():
            console.print(f"  {title}.{k} = {v.value:g} {v.unit}  [dim]({v.source})[/]")
    for d in ("fp32", "fp16", "bf16", "int8", "fp8"):
        v = t.peak_gflops_total(d)
        if v is not None and t.device == "cpu":
            console.print(f"  whole-device {d}: {_si(v * 1e9)}OP/s ({t.cores()} cores)")
    for k, v in t.instructions.items():
        console.print(f"  instructions.{k}: {', '.join(v) or 'none (no fast path)'}")
    if t.precision:
        console.print(f"  precision: {t.precision}")


def print_plan(p, model: str) -> None:
    dims = ", ".join(f"{k}={v}" for k, v in p.dims.items())
    console.print(f"[bold]plan[/] {escape(str(model))} on [bold]{p.target}[/] ({p.device})"
                  + (f", dims {dims}" if dims else "") + f": precision {p.requested} -> "
                  f"[bold]{p.precision}[/]")
    console.print("  ridge point (FLOP/B): " + ", ".join(f"{k} {v:.1f}" for k, v in p.ridge.items()))
    cols = [(c, "right" if c in ("FLOPs", "bytes", "FLOP/B", "pred us") else "left")
            for c in ("kernel", "ops", "FLOPs", "bytes", "FLOP/B", "bound", "precision",
                      "pred us", "why")]
    rows = []
    for k in p.kernels:
        ai = "inf" if k.intensity == float("inf") else f"{k.intensity:.2f}"
        if k.unknown:  # sizes decided at run time: no estimate to show
            rows.append([escape(k.name[:32]), escape(",".join(k.ops)[:28]), "unknown",
                         "unknown", "unknown", "unknown", k.precision, "unknown",
                         escape(k.why)])
            continue
        rows.append([escape(k.name[:32]), escape(",".join(k.ops)[:28]), _si(k.flops),
                     _si(k.bytes, "B"), ai, k.bound, k.precision, f"{k.time_us:.3f}",
                     escape(k.why)])
    # one precision throughout is in the header line already
    same = len({k.precision for k in p.kernels}) <= 1
    console.print(fitted_table(cols, rows, drop_order=("why", "ops", "bytes")
                               + (("precision",) if same else ())))
    console.print(f"  kernels: {p.kernels_before_fusion} before fusion -> {p.kernels_after_fusion} "
                  f"after; predicted latency {p.predicted_ms:.4f} ms (fp32 {p.predicted_fp32_ms:.4f} ms; "
                  "roofline only: no launch or framework overhead)")
    if p.unestimated:
        sizes = sorted({u for k in p.kernels for u in k.unknown})
        console.print(f"  {len(p.unestimated)} kernel(s) have sizes known only at run time "
                      f"(run-time sizes: {escape(', '.join(sizes))}): their cost is unknown and the predicted "
                      "latency counts them as size 1, a lower bound")
    console.print("  weight bytes: " + ", ".join(f"{k} {_si(v, 'B')}" for k, v in p.weight_bytes.items()))
    for d in p.decisions:
        colour = {"chosen": "green", "refused": "yellow", "downgraded": "red"}.get(d.action, "")
        console.print(f"  [{colour}]{d.precision} {d.action}[/]: {escape(d.reason)}")
    for note in p.dispatch_notes:
        console.print(f"  note: {escape(note)}")
    if p.dispatch:
        bf16 = any(c.get("library_bf16_ms") is not None for c in p.dispatch)
        console.print("  dispatch (each workload timed " + ("three ways: oneDNN fp32 and bf16, "
                      "default schedule" if bf16 else "both ways") + " on this host; "
                      "'cached': timed by an earlier compile):")
        ms = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731

        def choice(c):
            lower = c["choice"] == "library" and c.get("precision", "fp32") != "fp32"
            return c["choice"] + (f" {c['precision']}" if lower else "")

        rows = [[escape(c["kernel"].split("|")[0]), escape(_workload_shapes(c["kernel"])),
                 str(c["sites"]), choice(c), ms(c["library_ms"]),
                 *([ms(c.get("library_bf16_ms"))] if bf16 else []),
                 ms(c["codegen_ms"]) + (" (tuned)" if c.get("codegen_by") == "tuned" else ""),
                 _chosen_gflops(c),
                 "yes" if c["cached"] else ("no" if c.get("trusted", True) else "no (busy)")]
                for c in p.dispatch]
        cols = [("pattern", "left"), ("shapes", "left"), ("sites", "right"), ("choice", "left"),
                ("oneDNN ms", "right"), *([("bf16 ms", "right")] if bf16 else []),
                ("codegen ms", "right"), ("GFLOP/s", "right"), ("cached", "left")]
        console.print(fitted_table(cols, rows, drop_order=("cached", "GFLOP/s", "shapes")))


def _chosen_gflops(c: dict) -> str:
    """The rate the chosen side runs the workload at ('-' where its FLOPs or time are
    unknown): against the host's peak, how much any other kernel could still win."""
    if c["choice"] == "library":
        ms = c.get("library_bf16_ms") if c.get("precision") == "bf16" else c.get("library_ms")
    else:
        ms = c.get("codegen_ms")
    return "-" if not ms or not c.get("gflop") else f"{c['gflop'] / ms * 1e3:.0f}"


def _workload_shapes(key: str) -> str:
    """'1x56x56x64 * 3x3x64x64' from a workload key's R.Tensor((...), dtype=...) parts."""
    import re

    dims = re.findall(r"R\.Tensor\(\(([^)]*)\)", key)
    return " * ".join("x".join(d.replace(" ", "").split(",")) for d in dims[:2])


def print_bundle(bundle) -> None:
    """The bundle's path, size and what it holds."""
    mib = bundle.size_bytes / 2**20
    console.print(f"[green]bundle[/] {bundle.path}: {mib:.1f} MiB ({bundle.size_bytes} bytes), "
                  f"{len(bundle.files)} files, no Python")
    console.print(f"  on the board: tar xzf {bundle.path.name} && cd {bundle.top} && "
                  f"{escape(bundle.run_command)}", soft_wrap=True)  # a command to copy: never wrapped
    console.print(f"  (see {bundle.top}/README.txt)")
