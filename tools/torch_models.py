"""Real architectures in torch (random weights, fixed seeds) for benchmarks and tests.

torchvision-layout ResNet-18, MobileNetV2, a BERT-style encoder and a GPT-2-style decoder, plus
two the project's rules were not written against (a ConvNeXt-style stage with 7x7 depthwise
convolutions and LayerNorm, and a wide MLP). Defined here rather than imported from
torchvision, which does not load beside the CPU torch this project pins.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + idt)


class ResNet18(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        layers, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def _cbr(cin, cout, k, s, groups=1):
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(),
    )


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hid = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = [] if expand == 1 else [_cbr(cin, hid, 1, 1)]
        layers += [
            _cbr(hid, hid, 3, stride, groups=hid),
            nn.Conv2d(hid, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
               (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
        feats, cin = [_cbr(3, 32, 3, 2)], 32
        for t, c, n, s in cfg:
            for i in range(n):
                feats.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        feats.append(_cbr(cin, 1280, 1, 1))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.classifier(x)


class Attention(nn.Module):
    def __init__(self, hidden, heads, causal):
        super().__init__()
        self.h, self.d, self.causal = heads, hidden // heads, causal
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q = q.view(b, s, self.h, self.d).transpose(1, 2)
        k = k.view(b, s, self.h, self.d).transpose(1, 2)
        v = v.view(b, s, self.h, self.d).transpose(1, 2)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.d)
        if self.causal:
            mask = torch.tril(torch.ones(s, s, dtype=torch.bool, device=x.device))
            att = att.masked_fill(~mask, float("-inf"))
        y = att.softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, s, c))


class EncoderLayer(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.attn = Attention(hidden, heads, False)
        self.ln1 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x):
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class DecoderLayer(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, True)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Transformer(nn.Module):
    def __init__(self, causal, layers=4, hidden=256, heads=4, vocab=8192, max_len=512):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_len, hidden)
        blk = DecoderLayer if causal else EncoderLayer
        self.blocks = nn.ModuleList([blk(hidden, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(hidden)
        self.causal = causal
        if causal:
            self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.tok(ids) + self.pos(pos)
        if not self.causal:
            x = self.ln(x)
        for b in self.blocks:
            x = b(x)
        if self.causal:
            return self.head(self.ln(x))
        return x


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.ln = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.fc2(F.gelu(self.fc1(self.ln(y))))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtSmall(nn.Module):
    """Stem, two stages of ConvNeXt blocks with a strided downsample, a classifier."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 4, 4)
        self.s1 = nn.Sequential(*[ConvNeXtBlock(64) for _ in range(2)])
        self.down = nn.Conv2d(64, 128, 2, 2)
        self.s2 = nn.Sequential(*[ConvNeXtBlock(128) for _ in range(2)])
        self.head = nn.Linear(128, num_classes)

    def forward(self, x):
        x = self.s2(self.down(self.s1(self.stem(x))))
        return self.head(x.mean((2, 3)))


class WideMLP(nn.Module):
    def __init__(self, din=1024, hidden=4096, dout=1000):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(din, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, dout))

    def forward(self, x):
        return self.net(x)


class RecurrentTagger(nn.Module):
    """Embedding, a 2-layer bidirectional LSTM or GRU, a per-token classifier: a sequence
    tagger (NER / POS) as deployed on CPUs."""

    def __init__(self, cell="lstm", vocab=8192, emb=128, hidden=256, tags=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(emb, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.out = nn.Linear(2 * hidden, tags)

    def forward(self, ids):
        return self.out(self.rnn(self.emb(ids))[0])


class AudioEncoder(nn.Module):
    """A Whisper-style audio encoder: two Conv1d + GELU over log-mel frames (the second with
    stride 2), sinusoid-free learned positions, pre-norm transformer layers; 3000 frames in,
    1500 tokens through attention."""

    def __init__(self, mels=80, hidden=384, heads=6, layers=4, frames=3000):
        super().__init__()
        self.conv1 = nn.Conv1d(mels, hidden, 3, padding=1)
        self.conv2 = nn.Conv1d(hidden, hidden, 3, stride=2, padding=1)
        self.pos = nn.Parameter(torch.randn(frames // 2, hidden) * 0.02)
        self.blocks = nn.ModuleList([DecoderLayer(hidden, heads) for _ in range(layers)])
        for b in self.blocks:
            b.attn.causal = False
        self.ln = nn.LayerNorm(hidden)

    def forward(self, mel):
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.ln(x)


# name -> (constructor, example input for a batch size)
MODELS = {
    "resnet18": (ResNet18, lambda b: torch.randn(b, 3, 224, 224)),
    "mobilenetv2": (MobileNetV2, lambda b: torch.randn(b, 3, 224, 224)),
    "bert4l": (lambda: Transformer(False), lambda b: torch.randint(0, 8192, (b, 128))),
    "gpt2_4l": (lambda: Transformer(True), lambda b: torch.randint(0, 8192, (b, 128))),
    "convnext_small": (ConvNeXtSmall, lambda b: torch.randn(b, 3, 224, 224)),
    "wide_mlp": (WideMLP, lambda b: torch.randn(b, 1024)),
    "lstm_tagger": (RecurrentTagger, lambda b: torch.randint(0, 8192, (b, 64))),
    "gru_tagger": (lambda: RecurrentTagger("gru"), lambda b: torch.randint(0, 8192, (b, 64))),
    "audio_encoder": (AudioEncoder, lambda b: torch.randn(b, 80, 3000)),
}
MAIN_FOUR = ("resnet18", "mobilenetv2", "bert4l", "gpt2_4l")


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name][0]().eval()


def example(name: str, batch: int) -> torch.Tensor:
    torch.manual_seed(1)
    return MODELS[name][1](batch)


def export(name: str, out_dir: str, batch: int = 1) -> str:
    return export_onnx(build, example, name, out_dir, batch)


def export_onnx(build_fn, example_fn, name: str, out_dir: str, batch: int, prefix: str = "") -> str:
    """`torch.onnx.export` at opset 17 with a static batch; cached by file name."""
    path = os.path.join(out_dir, f"{prefix}{name}_b{batch}.onnx")
    if not os.path.exists(path):
        os.makedirs(out_dir, exist_ok=True)
        with torch.no_grad():
            torch.onnx.export(build_fn(name), (example_fn(name, batch),), path, opset_version=17,
                              dynamo=False, input_names=["input"], output_names=["output"])
    return path


# Token models whose sequence length a deployment varies: exported with symbolic batch and seq.
SEQUENCE_MODELS = ("bert4l", "gpt2_4l")


def example_at(name: str, batch: int, seq: int) -> torch.Tensor:
    """Token ids of shape (batch, seq) for a SEQUENCE_MODELS entry."""
    torch.manual_seed(1)
    return torch.randint(0, 8192, (batch, seq))


def export_dynamic(name: str, out_dir: str) -> str:
    """`torch.onnx.export` at opset 17 with symbolic dims (dynamic_axes), as models are
    normally exported: `batch` and `seq` for the token models, `batch` for the others (a
    CNN served at several batch sizes); cached by file name."""
    if name not in MODELS:
        raise SystemExit(f"dyn:{name}: unknown model (choose from {', '.join(MODELS)})")
    path = os.path.join(out_dir, f"{name}_dynamic.onnx")
    if not os.path.exists(path):
        os.makedirs(out_dir, exist_ok=True)
        seq = name in SEQUENCE_MODELS
        axes = {0: "batch", 1: "seq"} if seq else {0: "batch"}
        x = example_at(name, 1, 128) if seq else example(name, 1)
        with torch.no_grad():
            torch.onnx.export(build(name), (x,), path, opset_version=17,
                              dynamo=False, input_names=["input"], output_names=["output"],
                              dynamic_axes={"input": axes, "output": {0: "batch"} if not seq
                                            else axes})
    return path


def export_at(name: str, out_dir: str, batch: int, seq: int) -> str:
    """The same model exported with a static (batch, seq): the static build a dynamic one is
    compared with."""
    path = os.path.join(out_dir, f"{name}_b{batch}_s{seq}.onnx")
    if not os.path.exists(path):
        os.makedirs(out_dir, exist_ok=True)
        with torch.no_grad():
            torch.onnx.export(build(name), (example_at(name, batch, seq),), path,
                              opset_version=17, dynamo=False, input_names=["input"],
                              output_names=["output"])
    return path
