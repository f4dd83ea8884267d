#!/usr/bin/env python3
"""Build the two reference-size models of the tuning-cost figures in docs/performance.md and export them to ONNX.

    python tools/make_large_models.py /tmp/large      # writes resnet18.onnx and bert4.onnx

resnet18: the ResNet-18 architecture (BasicBlock x [2, 2, 2, 2], 1000 classes) at 1x3x224x224,
defined here because torchvision does not import beside this torch; random weights, non-trivial
batchnorm statistics. bert4: a 4-layer BERT-style encoder, hidden 256, 4 heads, FFN 1024,
sequence 128, vocabulary 30522. Both static shape, batch 1, opset 17. Not committed (tens of MB):
the figures come from tuning them, see docs/performance.md "Autotuning".
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn

OPSET = 17


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Bert(nn.Module):
    def __init__(self, vocab=30522, d=256, heads=4, layers=4, max_len=512, classes=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.norm = nn.LayerNorm(d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, input_ids):
        pos = torch.arange(input_ids.shape[1]).unsqueeze(0)
        return self.head(self.enc(self.norm(self.tok(input_ids) + self.pos(pos)))[:, 0])


def _init_bn(model):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return model


def export(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for name, build, example, input_name in (
            ("resnet18", lambda: _init_bn(ResNet18()), lambda: torch.randn(1, 3, 224, 224), "input"),
            ("bert4", Bert, lambda: torch.randint(0, 30522, (1, 128)), "input_ids")):
        torch.manual_seed(0)
        model = build().eval()
        path = out / f"{name}.onnx"
        torch.onnx.export(model, example(), str(path), input_names=[input_name],
                          output_names=["logits"], opset_version=OPSET, dynamo=False)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")
        made.append(path)
    return made


if __name__ == "__main__":
    export(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/large"))
