#!/usr/bin/env python3
"""Generate the bundled models into compiler/tvmopt/models/ (deterministic: fixed seeds, fixed opset).

    python tools/make_models.py            # all
    python tools/make_models.py mobile_cnn # one

mobile_cnn (the default): a MobileNet-style depthwise-separable CNN, 1x3x96x96, symbolic batch.
resnet_cnn: a standard conv-bn-relu residual CNN of similar FLOPs, for the "lightweight vs
standard" comparison. tiny_bert: a 2-layer BERT-style encoder (seq 32). Each a few hundred KB.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn

OUT = Path(__file__).resolve().parent.parent / "compiler" / "tvmopt" / "models"
OPSET = 17


def _dw_block(cin, cout, stride):
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU6(),
        nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6())


class MobileCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.blocks = nn.Sequential(_dw_block(16, 32, 1), _dw_block(32, 64, 2), _dw_block(64, 64, 1),
                                    _dw_block(64, 128, 2), _dw_block(128, 128, 1))
        self.head = nn.Linear(128, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class _Res(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                  nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return torch.relu(x + self.body(x))


class ResNetCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), _Res(16),
            nn.Conv2d(16, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), _Res(32),
            nn.MaxPool2d(2), _Res(32))
        self.head = nn.Linear(32, classes)

    def forward(self, x):
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.net(x), 1), 1))


class TinyBert(nn.Module):
    def __init__(self, vocab=1000, d=64, heads=4, layers=2, max_len=64, classes=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, input_ids):
        pos = torch.arange(input_ids.shape[1]).unsqueeze(0)
        return self.head(self.enc(self.tok(input_ids) + self.pos(pos))[:, 0])


def _export(name, model, example, input_name, dynamic_batch=True):
    torch.manual_seed(0)
    model.eval()
    path = OUT / f"{name}.onnx"
    dyn = {input_name: {0: "batch"}} if dynamic_batch else None
    torch.onnx.export(model, example, str(path), input_names=[input_name], output_names=["logits"],
                      opset_version=OPSET, dynamic_axes=dyn, dynamo=False)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")


def _init(model):
    torch.manual_seed(0)
    for m in model.modules():  # non-trivial batchnorm statistics, so folding them is exercised
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return model


MODELS = {
    "mobile_cnn": lambda: _export("mobile_cnn", _init(MobileCNN()), torch.randn(1, 3, 96, 96), "input"),
    "resnet_cnn": lambda: _export("resnet_cnn", _init(ResNetCNN()), torch.randn(1, 3, 96, 96), "input"),
    "tiny_bert": lambda: _export("tiny_bert", TinyBert(), torch.randint(0, 1000, (1, 32)),
                                 "input_ids"),
}


def main(names):
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names or MODELS:
        torch.manual_seed(0)
        MODELS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
