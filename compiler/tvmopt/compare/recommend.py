"""What to ship instead, ranked: each recommendation with the plan's predicted latency and, where
the variant was built and timed in the same run, the measured one (pure: no runtime here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class ModelFacts:
    """What the recommendations need to know about one side of the comparison."""

    label: str  # file name
    path: str
    precision: str  # "fp32", "int8 (dynamic)", "int8 (QDQ)", "fp16"
    flops: float
    quantized: bool  # dynamic quantization that `rewrite.fold_dynamic_quantization` can fold
    folded_path: str | None = None  # the folded variant, when built


@dataclass
class Recommendation:
    id: str
    action: str
    why: str
    model: str | None
    predicted_ms: float | None
    measured_ms: float | None

    def to_json(self) -> dict:
        return asdict(self)


_LAYOUT_OPS = {"transpose", "reshape", "layout_transform", "concatenate", "split", "squeeze",
               "flatten", "expand_dims", "strided_slice", "copy", "Transpose", "Reshape"}
# causes folding the quantization back to fp32 removes (or turns into fp32 compute)
_FOLDED = ("quantize", "int8_compute", "lost_fusion", "compute", "low_intensity_conv")


def _row(att: dict, cause: str) -> dict:
    return next(r for r in att["attribution"] if r["cause"] == cause)


def tie_noise(noise_ms: dict[str, float], path_a: str | None, path_b: str | None,
              floor_ms: float) -> float:
    """How far apart two measured medians must be to differ: their intervals combined, and at
    least 5% of `floor_ms`."""
    na, nb = noise_ms.get(path_a) or 0.0, noise_ms.get(path_b) or 0.0
    return max((na * na + nb * nb) ** 0.5, 0.05 * floor_ms)


def _pct(x: float) -> str:
    return f"{x:.0%}"


def recommend(att: dict, a: ModelFacts, b: ModelFacts, runtime: str, target: str,
              measured: dict[str, float], fp32_gflops: float | None,
              bandwidth_gbs: float | None, other_runtime_ms: dict[str, float] | None = None,
              noise_ms: dict[str, float] | None = None) -> list[Recommendation]:
    """Recommendations for one runtime, best first (measured before predicted-only).

    Args:
        att: `attribution.attribute` output.
        a, b: the two models.
        runtime: 'tvmopt' or 'onnxruntime'.
        target: the target's name (for the wording).
        measured: medians of extra variants timed in the same run, by path.
        fp32_gflops: achieved fp32 GFLOP/s of this runtime's dense kernels (to predict folded
            integer kernels of a model that is not a precision variant of the other), or None
            to keep the integer kernels' own time in the prediction.
        bandwidth_gbs: the target's memory bandwidth.
        other_runtime_ms: medians of A and B on the other runtime (key 'a' / 'b').
        noise_ms: half-width of a 95% interval of each timed model's median, by path.
    """
    recs: list[Recommendation] = []
    a_ms, b_ms = att["a_ms"], att["b_ms"]
    slower, faster = (b, a) if b_ms > a_ms else (a, b)
    slow_ms = max(a_ms, b_ms)
    positive = sorted((r for r in att["attribution"] if r["delta_ms"] > 0),
                      key=lambda r: r["delta_ms"], reverse=True)
    top = positive[0] if positive else None

    def cause_ms(cause, side):
        return _row(att, cause)[f"{side}_ms"]

    # 1. integer compute with run-time activation quantization -> fp32 activations
    same_work = a.flops and abs(a.flops - b.flops) <= 0.1 * a.flops
    for side, facts in (("b", b), ("a", a)):
        if not (facts.quantized and facts.folded_path):
            continue
        other = "a" if side == "b" else "b"
        q, i = cause_ms("quantize", side), cause_ms("int8_compute", side)
        side_ms, other_ms = (b_ms, a_ms) if side == "b" else (a_ms, b_ms)
        if same_work:
            # a precision variant of the other model: folding turns its quantization, integer
            # products and their extra kernels back into the other model's fp32 kernels; the
            # remaining causes keep their difference
            rest = sum(r[f"{side}_ms"] - r[f"{other}_ms"] for r in att["attribution"]
                       if r["cause"] not in _FOLDED) + att["unexplained_ms"] * (
                           1 if side == "b" else -1)
            predicted = other_ms + rest
        else:
            flops = _row(att, "int8_compute").get(f"{side}_flops") or 0.0
            # the same products in fp32, at the rate this runtime's fp32 dense kernels reach
            est = flops / (fp32_gflops * 1e6) if fp32_gflops and flops else i
            predicted = side_ms - q - i + est
        recs.append(Recommendation(
            "fold_quantization",
            f"keep activations fp32 and fold the int8 weights back: {facts.label}'s "
            "DynamicQuantizeLinear + ConvInteger/MatMulInteger become fp32 Conv/MatMul with "
            "the dequantized weights",
            f"its quantize/dequantize work ({q:.2f} ms) and integer products ({i:.2f} ms) on "
            f"{runtime} on {target} "
            + ("cost more than the fp32 kernels they stand for" if side_ms > other_ms
               else "become fp32 kernels (its int8 build is the faster one here)"),
            facts.folded_path, max(predicted, 0.0), measured.get(facts.folded_path)))

    # 2. the faster of the two as it is
    ratio = slow_ms / min(a_ms, b_ms) if min(a_ms, b_ms) > 0 else float("inf")
    if faster is b:
        gain = min(att["attribution"], key=lambda r: r["delta_ms"])
        fewer = (f"does {_pct(1 - b.flops / a.flops)} fewer FLOPs and " if b.flops < a.flops
                 else "")
        why = f"{b.label} {fewer}runs {ratio:.2f}x faster here"
        if gain["delta_ms"] < 0:
            why += f": {gain['label']} {gain['delta_ms']:+.2f} ms"
    else:
        why = (f"{b.label} saves {_pct(1 - b.flops / a.flops)} of FLOPs but is {ratio:.2f}x "
               "slower here" if b.flops < a.flops else f"{b.label} is {ratio:.2f}x slower here")
        if top is not None:
            why += f": {top['label']} add {top['delta_ms']:+.2f} ms"
            if top["cause"] in ("memory_bound", "low_intensity_conv"):
                g = (top.get("achieved_gbs") or {}).get("b")
                if g and bandwidth_gbs:
                    why += f" (its kernels reach {g:.1f} GB/s of {bandwidth_gbs:g})"
    recs.append(Recommendation(f"ship_{'a' if faster is a else 'b'}",
                               f"ship {faster.label} ({faster.precision}) as it is",
                               why, faster.path, min(a_ms, b_ms), min(a_ms, b_ms)))

    # 3. the biggest positive cause, where a change to the slower model targets it
    if top is not None and slower is b:
        d = top["delta_ms"]
        if top["cause"] == "lost_fusion" and runtime == "onnxruntime":
            recs.append(Recommendation(
                "compile_with_tvmopt", f"compile {b.label} with tvmopt, which fuses elementwise "
                "tails into their convolutions/matmuls",
                f"{b.label} runs {top['kernel_count']['b']:.0f} kernels vs "
                f"{top['kernel_count']['a']:.0f}", b.path, b_ms - d,
                (other_runtime_ms or {}).get("b")))
        elif top["cause"] == "layout":
            wrapped = sorted({o for k in top["kernels"] if k["model"] == "b"
                              for o in k["op"].split("+")} - _LAYOUT_OPS)
            if runtime == "tvmopt" and wrapped:
                action = (f"keep {b.label}'s convolutions in one layout through the ops between "
                          f"them: tvmopt's NHWC layout pass wraps {', '.join(wrapped)} in "
                          "transposes")
            else:
                action = (f"export {b.label} in one layout end to end (no transposes between "
                          "its convolutions and matmuls)")
            recs.append(Recommendation("keep_one_layout", action,
                                       f"layout transforms add {d:.2f} ms", None, b_ms - d, None))
        elif top["cause"] == "memory_bound" and bandwidth_gbs:
            row = top
            gbs = (row.get("achieved_gbs") or {}).get("b")
            if gbs:
                at_roof = row["b_ms"] * gbs / bandwidth_gbs
                recs.append(Recommendation(
                    "tune_memory_bound", f"tune {b.label}'s memory-bound kernels "
                    f"(tvmopt tune), or give them int8 weights where the plan allows",
                    f"they reach {gbs:.1f} GB/s of the target's {bandwidth_gbs:g}", b.path,
                    b_ms - row["b_ms"] + at_roof, None))
    if other_runtime_ms:
        other = "onnxruntime" if runtime == "tvmopt" else "tvmopt"
        side, ms = min(((k, v) for k, v in other_runtime_ms.items() if v is not None),
                       key=lambda kv: kv[1], default=(None, None))
        if ms is not None and ms < min(a_ms, b_ms):
            facts = a if side == "a" else b
            recs.append(Recommendation(
                f"switch_to_{other}", f"run {facts.label} on {other}",
                f"measured {ms:.2f} ms there in the same run", facts.path, ms, ms))
    # on this runtime first: another runtime is a different deployment, weighed by the verdict
    # across runtimes
    recs.sort(key=lambda r: (r.id.startswith("switch_to_"), r.measured_ms is None,
                             r.measured_ms if r.measured_ms is not None else r.predicted_ms))
    # a rewrite that measures within the noise of shipping a model as it is does not win:
    # the model as it is needs no new graph
    if recs[0].id == "fold_quantization":
        plain = next((r for r in recs if r.id.startswith("ship_")), None)
        noise = tie_noise(noise_ms or {}, recs[0].model, plain.model if plain else None,
                          min(a_ms, b_ms))
        if plain is not None and plain.measured_ms - recs[0].measured_ms <= noise:
            recs.remove(plain)
            plain.why += (f" (folding the quantization measured {recs[0].measured_ms:.2f} ms, "
                          f"within the noise of +-{noise:.2f} ms)")
            recs.insert(0, plain)
    return recs


def verdict(recs: list[Recommendation], att: dict, a: ModelFacts, b: ModelFacts, runtime: str,
            target: str) -> str:
    """One line: which model (and precision) to ship on this target, and why."""
    best = recs[0]
    slower_label = b.label if att["b_ms"] > att["a_ms"] else a.label
    why = best.why
    noise = att.get("noise_ms")
    caveat = ""
    if noise is not None and abs(att["delta_ms"]) <= noise:
        caveat = (f"; but B-A ({att['delta_ms']:+.2f} ms) is within the measurement noise "
                  f"(+-{noise:.2f} ms): rerun on a quieter machine before deciding")
    if best.id == "fold_quantization":
        name = best.model.rsplit("/", 1)[-1]
        return (f"on {target} with {runtime}: ship {name} (fp32 activations, dequantized int8 "
                f"weights): {best.measured_ms:.2f} ms measured vs {att['a_ms']:.2f} ms "
                f"({a.label}) and {att['b_ms']:.2f} ms ({b.label}); {why}{caveat}")
    ms = best.measured_ms if best.measured_ms is not None else best.predicted_ms
    return (f"on {target} with {runtime}: {best.action} ({ms:.2f} ms vs "
            f"{max(att['a_ms'], att['b_ms']):.2f} ms for {slower_label}); {why}{caveat}")
