#!/usr/bin/env python3
"""Generate "standard vs lightweight variant" model pairs for `tvmopt compare` (fixed seeds).

    python tools/make_variant_pairs.py OUT_DIR          # every model, and OUT_DIR/pairs.json

Models (torch.onnx.export, opset 17, batch 1):
  cnn           conv3x3-bn-relu stages (32-64-128 channels), 1x3x64x64
  cnn_dw        the same network with every dense 3x3 conv replaced by a depthwise 3x3 + 1x1
  tfm           a 2-layer BERT-style encoder, hidden 128, 4 heads, 64 tokens
  tfm_dw        the same encoder with attention replaced by a depthwise-separable token mixer
                (depthwise conv over the sequence + pointwise conv)
  mobilenetv2   MobileNetV2, 1x3x224x224 (tools/torch_models.py)
  gpt2          a GPT-2-style decoder, 4 layers, hidden 256, 4 heads, 128 tokens, tied-size
                LM head over 8192 tokens (tools/torch_models.py)
  *_int8        onnxruntime's `quantize_dynamic` (int8 weights, activations quantized at run
                time: DynamicQuantizeLinear + ConvInteger / MatMulInteger)
  *_qdq         onnxruntime's `quantize_static` in QDQ format (per-channel int8 weights, u8
                activations calibrated on seeded inputs)

pairs.json lists (A, B) = (standard, variant) pairs: structure and precision variants, CNNs and
transformers. The small models build in seconds; MobileNetV2 and the GPT-2 decoder are the
sizes whose builds `--dispatch auto` (the default) gives oneDNN kernels, dynamic int8 ones
included, so a comparison that stops explaining library kernels shows on them.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # a sibling in tools/
import torch_models  # noqa: E402

OPSET = 17


def _cbr(cin, cout, k, s, groups=1):
    return [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout),
            nn.ReLU()]


class SmallCNN(nn.Module):
    """Two convs per stage; `separable` swaps each dense 3x3 for depthwise 3x3 + pointwise 1x1."""

    def __init__(self, separable: bool, widths=(32, 64, 128), classes=10):
        super().__init__()
        layers, cin = _cbr(3, widths[0], 3, 2), widths[0]
        for i, c in enumerate(widths):
            for j in range(2):
                stride = 2 if (j == 0 and i > 0) else 1
                if separable:
                    layers += _cbr(cin, cin, 3, stride, groups=cin) + _cbr(cin, c, 1, 1)
                else:
                    layers += _cbr(cin, c, 3, stride)
                cin = c
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class _Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.h, self.d = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, c = x.shape
        q, k, v = (t.view(b, s, self.h, self.d).transpose(1, 2) for t in self.qkv(x).split(c, -1))
        att = ((q @ k.transpose(-1, -2)) / math.sqrt(self.d)).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, s, c))


class _SeparableMixer(nn.Module):
    """Token mixing by a depthwise conv along the sequence and a pointwise conv (no attention)."""

    def __init__(self, hidden, kernel=7):
        super().__init__()
        self.dw = nn.Conv1d(hidden, hidden, kernel, padding=kernel // 2, groups=hidden)
        self.pw = nn.Conv1d(hidden, hidden, 1)

    def forward(self, x):
        return self.pw(F.gelu(self.dw(x.transpose(1, 2)))).transpose(1, 2)


class _Layer(nn.Module):
    def __init__(self, hidden, heads, separable):
        super().__init__()
        self.mix = _SeparableMixer(hidden) if separable else _Attention(hidden, heads)
        self.ln1 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x):
        x = self.ln1(x + self.mix(x))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class SmallEncoder(nn.Module):
    def __init__(self, separable: bool, layers=2, hidden=128, heads=4, vocab=1024, seq=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.randn(1, seq, hidden) * 0.02)
        self.blocks = nn.ModuleList([_Layer(hidden, heads, separable) for _ in range(layers)])

    def forward(self, ids):
        x = self.tok(ids) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return x


MODELS = {
    "cnn": (lambda: SmallCNN(False), lambda: torch.randn(1, 3, 64, 64)),
    "cnn_dw": (lambda: SmallCNN(True), lambda: torch.randn(1, 3, 64, 64)),
    "tfm": (lambda: SmallEncoder(False), lambda: torch.randint(0, 1024, (1, 64))),
    "tfm_dw": (lambda: SmallEncoder(True), lambda: torch.randint(0, 1024, (1, 64))),
    "mobilenetv2": (lambda: torch_models.MODELS["mobilenetv2"][0](),
                    lambda: torch_models.MODELS["mobilenetv2"][1](1)),
    "gpt2": (lambda: torch_models.MODELS["gpt2_4l"][0](),
             lambda: torch_models.MODELS["gpt2_4l"][1](1)),
}
PAIRS = [("cnn", "cnn_dw"), ("cnn", "cnn_int8"), ("cnn_dw", "cnn_dw_int8"),
         ("tfm", "tfm_dw"), ("tfm", "tfm_int8"), ("tfm_dw", "tfm_dw_int8"),
         ("mobilenetv2", "mobilenetv2_int8"), ("gpt2", "gpt2_int8"), ("tfm", "tfm_qdq")]
QUANTIZED = ("_int8", "_qdq")


def _randomize_bn(module: nn.Module) -> None:
    """Non-trivial BatchNorm statistics, so folding them is not a no-op."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)


def export(name: str, out: Path) -> Path:
    path = out / f"{name}.onnx"
    torch.manual_seed(0)
    model = MODELS[name][0]().eval()
    _randomize_bn(model)
    torch.manual_seed(1)
    example = MODELS[name][1]()
    with torch.no_grad():
        torch.onnx.export(model, (example,), str(path), opset_version=OPSET, dynamo=False,
                          input_names=["input"], output_names=["output"])
    return path


def quantize(src: Path, dst: Path, name: str = "") -> Path:
    """`quantize_dynamic` for *_int8, `quantize_static` (QDQ) for *_qdq, calibrated on seeded
    inputs drawn like the model's example."""
    import logging

    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)

    logging.getLogger().setLevel(logging.ERROR)
    if not dst.name.endswith("_qdq.onnx"):
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
        return dst

    class Reader(CalibrationDataReader):
        def __init__(self):
            torch.manual_seed(2)
            self.it = iter([{"input": MODELS[name][1]().numpy()} for _ in range(8)])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return dst


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    variants = {b for _, b in PAIRS if b.endswith(QUANTIZED)}
    for name in MODELS:
        fp32 = export(name, out)
        made = [v for v in sorted(variants) if v.rsplit("_", 1)[0] == name]
        for v in made:
            quantize(fp32, out / f"{v}.onnx", name)
        print(f"wrote {fp32}" + "".join(f" and {v}.onnx" for v in made))
    pairs = [{"a": str(out / f"{a}.onnx"), "b": str(out / f"{b}.onnx")} for a, b in PAIRS]
    (out / "pairs.json").write_text(json.dumps(pairs, indent=1) + "\n")
    print(f"wrote {out / 'pairs.json'} ({len(pairs)} pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
