"""`compare MODEL --precisions fp32,fp16,int8`: precision variants of one model, each compared
with the first the same way two models are.

int8 is onnxruntime's `quantize_dynamic` of the model (int8 weights, activations quantized at
run time); fp16 is the pipeline's own fp16 precision (`compile --precision fp16`) and is refused,
in one line, on a target without fp16 arithmetic.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import TargetError, error_line
from .run import PRECISIONS, CompareOptionError, CompareOptions, model_precision, run_compare


def fp16_refusal(hw) -> str | None:
    """Why `hw` gets no fp16 variant, or None when it has fp16 arithmetic."""
    if not hw.fast_instructions("fp16") or hw.peak_gflops_total("fp16") is None:
        return (f"fp16 on {hw.name}: the target has no fp16 arithmetic ({hw.path} lists no "
                "fp16 instructions/peak), so fp16 would run as fp32 plus conversions")
    return None


def quantize_int8(src: str, dst: Path) -> None:
    """onnxruntime's `quantize_dynamic` with int8 weights (its pre-processing advice muted)."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(src, str(dst), weight_type=QuantType.QInt8)
    except Exception as err:  # onnxruntime's quantizer raises plain exceptions
        reason = error_line(err)
        raise CompareOptionError(f"quantize_dynamic cannot quantize {src}: {reason}") from None
    finally:
        root.setLevel(level)


def run_precisions(model: str, precisions: list[str], common: dict, log=print) -> list[dict]:
    """Compare precisions[0] of `model` with each other precision.

    Returns:
        One compare document per pair (each with `refused`: the precisions left out and why).

    Raises:
        CompareOptionError: unknown or repeated precisions, or fewer than two left.
    """
    from ..frontend.onnx_model import load_onnx
    from ..targets.registry import get_target

    bad = [p for p in precisions if p not in PRECISIONS]
    if bad or len(set(precisions)) != len(precisions):
        what = f"unknown {', '.join(bad)}" if bad else "a precision is repeated"
        raise CompareOptionError(f"--precisions: {what} (choose from {', '.join(PRECISIONS)})")
    hw = get_target(common.get("target") or "x86")
    proto = load_onnx(model)
    own = model_precision(proto)
    if own != "fp32":
        raise CompareOptionError(f"{model} is already {own}: --precisions derives variants "
                                 "from an fp32 model")
    out = Path(common.get("output") or f"tvmopt-out/compare/{Path(model).stem}-precisions")
    out.mkdir(parents=True, exist_ok=True)
    refused, paths = [], {}
    for p in precisions:
        if p == "fp32":
            paths[p] = (model, None)
        elif p == "int8":
            dst = out / f"{Path(model).stem}.int8.onnx"
            log(f"int8: quantize_dynamic({Path(model).name}) -> {dst}")
            quantize_int8(model, dst)
            paths[p] = (str(dst), None)
        elif p == "fp16":
            why = fp16_refusal(hw)
            if why is None and common.get("runtime") != "tvmopt":
                why = ("fp16 on onnxruntime: no fp16 ONNX conversion here; compare fp16 with "
                       "--runtime tvmopt (the pipeline's fp16 precision)")
            if why:
                refused.append(why)
                continue
            paths[p] = (model, "fp16")
    if len(paths) < 2:
        raise TargetError("; ".join(refused) or "--precisions needs at least two precisions")
    for why in refused:
        log(f"refused: {why}")
    names = list(paths)
    docs = []
    for other in names[1:]:
        (a, pa), (b, pb) = paths[names[0]], paths[other]
        opts = CompareOptions(a=a, b=b, **{**common, "output": str(out / f"{names[0]}-vs-{other}")},
                              compile_precision={"a": pa, "b": pb})
        doc = run_compare(opts, log=log)
        doc["precisions"] = {"a": names[0], "b": other}
        doc["refused"] = refused
        docs.append(doc)
    return docs
