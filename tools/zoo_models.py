"""The zoo's architectures: published designs built from torch and `transformers` code with random
weights and fixed seeds (nothing downloaded), at small sizes so one compile takes seconds.

Each entry is an `Arch`: a builder returning the nn.Module (eval mode, batch norms calibrated),
its example inputs, which of their axes are symbolic (named dims, exported as such by both ONNX
exporters and by torch.export), and the values those dims take when the zoo checks the compiled
model (realistic sizes, not 1). Architectures `transformers` has are taken from it, built from a
small config of the upstream class; the others (torchvision's designs, which cannot load beside
this project's CPU torch, and the detection / diffusion blocks) are written here after their
papers and reference code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Arch:
    """One zoo architecture.

    Attributes:
        family: the kind of model users deploy it as (the docs group by it).
        build: returns the nn.Module (random weights, seeded, eval mode).
        inputs: returns {name: example tensor} at the export sizes.
        dynamic: {input name: {axis: dim name}} exported as symbolic.
        check: {dim name: value} the compiled model is checked at (different from the export
            example, so a size baked in at export shows up).
        vocab: token ids are drawn below this (text inputs); 0 for float inputs.
        notes: what the architecture exercises.
        multiple_of: {dim name: k} for a dim the model only takes in multiples of k.
        static_in_export: {exporter: dim names} the exporter cannot keep symbolic (torch.export
            unrolls nn.LSTM/GRU over the sequence): exported at the example's size there.
        ranges: {dim name: (lo, hi)} where the model's own limits differ from the zoo's
            defaults (position tables, a convolution stem's receptive field).
    """

    family: str
    build: Callable[[], nn.Module]
    inputs: Callable[[dict], dict]
    dynamic: dict = field(default_factory=dict)
    check: dict = field(default_factory=dict)
    vocab: int = 0
    notes: str = ""
    multiple_of: dict = field(default_factory=dict)
    static_in_export: dict = field(default_factory=dict)
    ranges: dict = field(default_factory=dict)


# ------------------------------------------------------------------------ helpers
class Outputs(nn.Module):
    """A model's tensor outputs as a tuple (ModelOutput dicts and caches do not export as one)."""

    def __init__(self, model, keys, **kwargs):
        super().__init__()
        self.model, self.keys, self.kwargs = model, tuple(keys), kwargs

    def forward(self, *args):
        out = self.model(*args, **self.kwargs)
        res = tuple(getattr(out, k) if not isinstance(out, (tuple, list)) else out[k]
                    for k in self.keys)
        return res[0] if len(res) == 1 else res


def calibrate(model: nn.Module, example: Callable[[], tuple]) -> nn.Module:
    """Batch norms of unit scale with statistics measured on random inputs, as training leaves
    them (tools/hf_models.py): with a library's init activations shrink to zeros, and an all-zero
    output verifies nothing."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return model.eval()
    for m in norms:
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        model(*example())
    return model.eval()


def _images(size=128, batch=2):
    return lambda dims: {"pixel_values": torch.randn(dims.get("batch", batch), 3,
                                                     dims.get("height", size),
                                                     dims.get("width", size))}


def _image_cal(size=128):
    return lambda: (torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(2)),)


IMG_DYN = {"pixel_values": {0: "batch"}}
IMG_HW_DYN = {"pixel_values": {0: "batch", 2: "height", 3: "width"}}


def _cnn(family, make, notes, size=128, hw=False):
    def build():
        return calibrate(make(), _image_cal(size))

    return Arch(family, build, _images(size), IMG_HW_DYN if hw else IMG_DYN,
                {"batch": 3, **({"height": size + 32, "width": size - 32} if hw else {})},
                notes=notes, multiple_of={"height": 8, "width": 8} if hw else {})


def conv_bn(cin, cout, k=3, s=1, groups=1, act=nn.ReLU, dilation=1):
    layers = [nn.Conv2d(cin, cout, k, s, dilation * (k - 1) // 2, dilation=dilation,
                        groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)


# ------------------------------------------------------------------------ MobileNetV3
class SqueezeExcite(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))


class MBv3Block(nn.Module):
    def __init__(self, cin, hid, cout, k, s, se, act):
        super().__init__()
        self.res = s == 1 and cin == cout
        self.expand = conv_bn(cin, hid, 1, act=act) if hid != cin else nn.Identity()
        self.dw = conv_bn(hid, hid, k, s, groups=hid, act=act)
        self.se = SqueezeExcite(hid) if se else nn.Identity()
        self.project = conv_bn(hid, cout, 1, act=None)

    def forward(self, x):
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.res else y


class MobileNetV3Small(nn.Module):
    """MobileNetV3-Small's block table (Howard et al. 2019), first eight blocks."""

    CFG = [(16, 16, 16, 3, 2, True, nn.ReLU), (16, 72, 24, 3, 2, False, nn.ReLU),
           (24, 88, 24, 3, 1, False, nn.ReLU), (24, 96, 40, 5, 2, True, nn.Hardswish),
           (40, 240, 40, 5, 1, True, nn.Hardswish), (40, 120, 48, 5, 1, True, nn.Hardswish),
           (48, 288, 96, 5, 2, True, nn.Hardswish)]

    def __init__(self, classes=100):
        super().__init__()
        self.stem = conv_bn(3, 16, 3, 2, act=nn.Hardswish)
        self.blocks = nn.Sequential(*[MBv3Block(*c) for c in self.CFG])
        self.last = conv_bn(96, 288, 1, act=nn.Hardswish)
        self.head = nn.Sequential(nn.Linear(288, 512), nn.Hardswish(), nn.Dropout(0.2),
                                  nn.Linear(512, classes))

    def forward(self, x):
        x = self.last(self.blocks(self.stem(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ------------------------------------------------------------------------ DenseNet
class DenseLayer(nn.Module):
    def __init__(self, cin, growth, bn_size=4):
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, feats):
        x = torch.cat(feats, 1)
        x = self.conv1(F.relu(self.norm1(x)))
        return self.conv2(F.relu(self.norm2(x)))


class DenseBlock(nn.Module):
    def __init__(self, n, cin, growth):
        super().__init__()
        self.layers = nn.ModuleList([DenseLayer(cin + i * growth, growth) for i in range(n)])

    def forward(self, x):
        feats = [x]
        for layer in self.layers:
            feats.append(layer(feats))
        return torch.cat(feats, 1)


class DenseNet(nn.Module):
    """torchvision's DenseNet layout (BN-ReLU-Conv, concatenated features, transitions with
    average pooling), blocks (3, 3, 3), growth 16."""

    def __init__(self, blocks=(3, 3, 3), growth=16, init=32, classes=100):
        super().__init__()
        layers, c = [nn.Conv2d(3, init, 7, 2, 3, bias=False), nn.BatchNorm2d(init), nn.ReLU(),
                     nn.MaxPool2d(3, 2, 1)], init
        for i, n in enumerate(blocks):
            layers.append(DenseBlock(n, c, growth))
            c += n * growth
            if i < len(blocks) - 1:
                layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False),
                           nn.AvgPool2d(2, 2)]
                c //= 2
        self.features = nn.Sequential(*layers, nn.BatchNorm2d(c))
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        x = F.relu(self.features(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ------------------------------------------------------------------------ Inception
class InceptionA(nn.Module):
    """Inception-v3's 35x35 block: 1x1, 5x5, double 3x3 and pooled branches concatenated."""

    def __init__(self, cin, pool_c):
        super().__init__()
        self.b1 = conv_bn(cin, 32, 1)
        self.b5 = nn.Sequential(conv_bn(cin, 24, 1), conv_bn(24, 32, 5))
        self.b3 = nn.Sequential(conv_bn(cin, 32, 1), conv_bn(32, 48, 3), conv_bn(48, 48, 3))
        self.bp = conv_bn(cin, pool_c, 1)

    def forward(self, x):
        p = F.avg_pool2d(x, 3, 1, 1)
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), self.bp(p)], 1)


class InceptionC(nn.Module):
    """Inception-v3's factorized 7x7 block: 1x7 and 7x1 convolutions."""

    def __init__(self, cin, c7=32):
        super().__init__()
        self.b1 = conv_bn(cin, 48, 1)
        self.b7 = nn.Sequential(conv_bn(cin, c7, 1), nn.Conv2d(c7, c7, (1, 7), padding=(0, 3)),
                                nn.ReLU(), nn.Conv2d(c7, 48, (7, 1), padding=(3, 0)), nn.ReLU())
        self.bp = conv_bn(cin, 48, 1)

    def forward(self, x):
        return torch.cat([self.b1(x), self.b7(x), self.bp(F.avg_pool2d(x, 3, 1, 1))], 1)


class InceptionNet(nn.Module):
    def __init__(self, classes=100):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 32, 3, 2), conv_bn(32, 64, 3), nn.MaxPool2d(3, 2))
        self.a = InceptionA(64, 32)  # 144 channels out
        self.reduce = nn.Sequential(conv_bn(144, 144, 3, 2))
        self.c = InceptionC(144)
        self.fc = nn.Linear(144, classes)

    def forward(self, x):
        x = self.c(self.reduce(self.a(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ------------------------------------------------------------------------ ShuffleNetV2
def channel_shuffle(x, groups):
    b, c, h, w = x.shape
    x = x.view(b, groups, c // groups, h, w).transpose(1, 2).contiguous()
    return x.view(b, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.stride, h = stride, cout // 2
        if stride > 1:
            self.left = nn.Sequential(conv_bn(cin, cin, 3, stride, groups=cin, act=None),
                                      conv_bn(cin, h, 1))
        right_in = cin if stride > 1 else h
        self.right = nn.Sequential(conv_bn(right_in, h, 1),
                                   conv_bn(h, h, 3, stride, groups=h, act=None), conv_bn(h, h, 1))

    def forward(self, x):
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)  # torchvision's split
            out = torch.cat((a, self.right(b)), 1)
        else:
            out = torch.cat((self.left(x), self.right(x)), 1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, widths=(24, 48, 96, 192), repeats=(2, 3, 2), classes=100):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, widths[0], 3, 2), nn.MaxPool2d(3, 2, 1))
        stages, c = [], widths[0]
        for w, n in zip(widths[1:], repeats):
            stages += [ShuffleUnit(c, w, 2)] + [ShuffleUnit(w, w, 1) for _ in range(n - 1)]
            c = w
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        return self.fc(self.stages(self.stem(x)).mean((2, 3)))


# ------------------------------------------------------------------------ UNet
class UNet(nn.Module):
    """Ronneberger et al.'s encoder/decoder: ConvTranspose2d up-convolutions and a bilinear
    upsample, skip connections concatenated; fully convolutional, so H and W stay symbolic."""

    def __init__(self, c=16, classes=3):
        super().__init__()

        def double(cin, cout):
            return nn.Sequential(conv_bn(cin, cout), conv_bn(cout, cout))

        self.e1, self.e2, self.e3 = double(3, c), double(c, 2 * c), double(2 * c, 4 * c)
        self.bottom = double(4 * c, 8 * c)
        self.up3 = nn.ConvTranspose2d(8 * c, 4 * c, 2, stride=2)
        self.d3 = double(8 * c, 4 * c)
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.d2 = double(4 * c, 2 * c)
        self.d1 = double(3 * c, c)
        self.out = nn.Conv2d(c, classes, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(F.max_pool2d(a, 2))
        c = self.e3(F.max_pool2d(b, 2))
        m = self.bottom(F.max_pool2d(c, 2))
        y = self.d3(torch.cat([self.up3(m), c], 1))
        y = self.d2(torch.cat([self.up2(y), b], 1))
        y = F.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.out(self.d1(torch.cat([y, a], 1)))


# ------------------------------------------------------------------------ DeepLabV3
class ASPP(nn.Module):
    """DeepLabV3's atrous spatial pyramid pooling: 1x1, three dilated 3x3 and an image-pooling
    branch broadcast back by bilinear resize."""

    def __init__(self, cin, c=64, rates=(2, 4, 6)):
        super().__init__()
        self.branches = nn.ModuleList([conv_bn(cin, c, 1)]
                                      + [conv_bn(cin, c, 3, dilation=r) for r in rates])
        self.pool = conv_bn(cin, c, 1)
        self.project = conv_bn(c * (len(rates) + 2), c, 1)

    def forward(self, x):
        h, w = x.shape[-2:]
        p = F.interpolate(self.pool(F.adaptive_avg_pool2d(x, 1)), size=(h, w), mode="bilinear",
                          align_corners=False)
        return self.project(torch.cat([b(x) for b in self.branches] + [p], 1))


class DeepLabV3(nn.Module):
    """A ResNet backbone whose last stage is dilated (output stride 8), the ASPP head, and the
    logits resized back to the input."""

    def __init__(self, classes=5):
        super().__init__()
        self.backbone = nn.Sequential(
            conv_bn(3, 32, 3, 2), conv_bn(32, 32, 3), nn.MaxPool2d(3, 2, 1),
            conv_bn(32, 64, 3, 2), conv_bn(64, 64, 3, dilation=2), conv_bn(64, 64, 3, dilation=4))
        self.aspp = ASPP(64)
        self.cls = nn.Conv2d(64, classes, 1)

    def forward(self, x):
        h, w = x.shape[-2:]
        y = self.cls(self.aspp(self.backbone(x)))
        return F.interpolate(y, size=(h, w), mode="bilinear", align_corners=False)


# ------------------------------------------------------------------------ YOLO
class ConvSiLU(nn.Module):
    def __init__(self, cin, cout, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.silu(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c, shortcut=True):
        super().__init__()
        self.cv1, self.cv2, self.add = ConvSiLU(c, c, 3), ConvSiLU(c, c, 3), shortcut

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    """YOLOv5's CSP block."""

    def __init__(self, cin, cout, n=1):
        super().__init__()
        h = cout // 2
        self.cv1, self.cv2, self.cv3 = ConvSiLU(cin, h), ConvSiLU(cin, h), ConvSiLU(2 * h, cout)
        self.m = nn.Sequential(*[Bottleneck(h) for _ in range(n)])

    def forward(self, x):
        return self.cv3(torch.cat([self.m(self.cv1(x)), self.cv2(x)], 1))


class C2f(nn.Module):
    """YOLOv8's block: `chunk` into two halves, each bottleneck's output concatenated."""

    def __init__(self, cin, cout, n=1):
        super().__init__()
        self.h = cout // 2
        self.cv1, self.cv2 = ConvSiLU(cin, 2 * self.h), ConvSiLU((2 + n) * self.h, cout)
        self.m = nn.ModuleList([Bottleneck(self.h) for _ in range(n)])

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.cv1, self.cv2 = ConvSiLU(c, c // 2), ConvSiLU(2 * c, c)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        x = self.cv1(x)
        a = self.pool(x)
        b = self.pool(a)
        return self.cv2(torch.cat([x, a, b, self.pool(b)], 1))


class YOLO(nn.Module):
    """A YOLOv5 (C3) or YOLOv8 (C2f + decoupled head with DFL) detector: backbone, SPPF, a
    top-down neck with nearest upsampling, and the head decoding boxes against a grid built
    from the feature map's size."""

    def __init__(self, v8: bool, c=16, classes=8, reg_max=8):
        super().__init__()
        block = C2f if v8 else C3
        self.v8, self.classes, self.reg_max = v8, classes, reg_max
        self.s1 = nn.Sequential(ConvSiLU(3, c, 3, 2), ConvSiLU(c, 2 * c, 3, 2), block(2 * c, 2 * c),
                                ConvSiLU(2 * c, 4 * c, 3, 2), block(4 * c, 4 * c))
        self.s2 = nn.Sequential(ConvSiLU(4 * c, 8 * c, 3, 2), block(8 * c, 8 * c), SPPF(8 * c))
        self.neck = block(12 * c, 4 * c)
        out = 4 * reg_max + classes if v8 else 3 * (5 + classes)
        self.heads = nn.ModuleList([nn.Conv2d(4 * c, out, 1), nn.Conv2d(8 * c, out, 1)])
        self.register_buffer("proj", torch.arange(reg_max, dtype=torch.float32))

    def _decode(self, p, stride):
        b, _, h, w = p.shape
        ys, xs = torch.meshgrid(torch.arange(h, dtype=p.dtype), torch.arange(w, dtype=p.dtype),
                                indexing="ij")
        grid = torch.stack((xs, ys), 0).view(1, 2, h * w) + 0.5
        p = p.view(b, -1, h * w)
        if self.v8:
            box, cls = p.split((4 * self.reg_max, self.classes), 1)  # split, then DFL
            dist = (box.view(b, 4, self.reg_max, h * w).softmax(2)
                    * self.proj.view(1, 1, -1, 1)).sum(2)
            lt, rb = dist.chunk(2, 1)
            xy = (grid + (rb - lt) / 2) * stride
            wh = (lt + rb) * stride
            return torch.cat([xy, wh, cls.sigmoid()], 1)
        p = p.view(b, 3, 5 + self.classes, h * w).sigmoid()
        xy, wh, conf = p.split((2, 2, 1 + self.classes), 2)
        xy = (xy * 2 - 0.5 + grid.unsqueeze(1)) * stride
        return torch.cat([xy, (wh * 2) ** 2 * stride, conf], 2).view(b, -1, h * w)

    def forward(self, x):
        p3 = self.s1(x)
        p4 = self.s2(p3)
        n = self.neck(torch.cat([F.interpolate(p4, scale_factor=2.0, mode="nearest"), p3], 1))
        return torch.cat([self._decode(self.heads[0](n), 8), self._decode(self.heads[1](p4), 16)],
                         2)


# ------------------------------------------------------------------------ recurrent
class Tagger(nn.Module):
    """Embedding, a 2-layer bidirectional LSTM or GRU, a per-token classifier."""

    def __init__(self, cell, vocab=500, d=64, tags=9):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = getattr(nn, cell)(d, d, num_layers=2, bidirectional=True, batch_first=True)
        self.out = nn.Linear(2 * d, tags)

    def forward(self, input_ids):
        return self.out(self.rnn(self.emb(input_ids))[0])


# ------------------------------------------------------------------------ Stable Diffusion block
class ResnetBlock(nn.Module):
    def __init__(self, cin, cout, temb):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(temb, cout)
        self.n2, self.c2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, t):
        h = self.c1(F.silu(self.n1(x))) + self.t(F.silu(t))[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))


class Attention(nn.Module):
    """diffusers' Attention: q/k/v projections, scaled-dot-product attention over heads."""

    def __init__(self, c, ctx, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(c, c, bias=False), nn.Linear(ctx, c, bias=False), \
            nn.Linear(ctx, c, bias=False)
        self.o = nn.Linear(c, c)

    def forward(self, x, ctx):
        b, n, c = x.shape

        def split(t):
            return t.view(b, -1, self.heads, c // self.heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(ctx)), split(self.v(ctx)))
        return self.o(y.transpose(1, 2).reshape(b, n, c))


class CrossAttnTransformer(nn.Module):
    """SD's spatial transformer: GroupNorm, proj-in, self-attention, cross-attention over the
    text states, a GEGLU feed-forward, proj-out, residual."""

    def __init__(self, c, ctx, heads=4):
        super().__init__()
        self.norm, self.proj_in, self.proj_out = nn.GroupNorm(8, c), nn.Linear(c, c), nn.Linear(c, c)
        self.n1, self.n2, self.n3 = nn.LayerNorm(c), nn.LayerNorm(c), nn.LayerNorm(c)
        self.attn1, self.attn2 = Attention(c, c, heads), Attention(c, ctx, heads)
        self.ff_in, self.ff_out = nn.Linear(c, 8 * c), nn.Linear(4 * c, c)

    def forward(self, x, context):
        b, c, h, w = x.shape
        y = self.proj_in(self.norm(x).flatten(2).transpose(1, 2))
        q = self.n1(y)
        y = y + self.attn1(q, q)
        y = y + self.attn2(self.n2(y), context)
        a, gate = self.ff_in(self.n3(y)).chunk(2, -1)
        y = y + self.ff_out(a * F.gelu(gate))
        return x + self.proj_out(y).transpose(1, 2).reshape(b, c, h, w)


class SDUNetBlock(nn.Module):
    """A Stable-Diffusion UNet down/mid/up slice: timestep embedding, ResNet blocks with
    GroupNorm, a cross-attention transformer, a strided downsample and a nearest upsample."""

    def __init__(self, c=32, ctx=48, temb=64):
        super().__init__()
        self.c = c
        self.time = nn.Sequential(nn.Linear(c, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.conv_in = nn.Conv2d(4, c, 3, padding=1)
        self.r1, self.a1 = ResnetBlock(c, c, temb), CrossAttnTransformer(c, ctx)
        self.down = nn.Conv2d(c, c, 3, 2, 1)
        self.r2, self.a2 = ResnetBlock(c, 2 * c, temb), CrossAttnTransformer(2 * c, ctx)
        self.up = nn.Conv2d(2 * c, c, 3, padding=1)
        self.r3 = ResnetBlock(2 * c, c, temb)
        self.out = nn.Sequential(nn.GroupNorm(8, c), nn.SiLU(), nn.Conv2d(c, 4, 3, padding=1))

    def forward(self, sample, timestep, encoder_hidden_states):
        half = self.c // 2
        freqs = torch.exp(-9.21 * torch.arange(half, dtype=torch.float32) / half)
        arg = timestep[:, None].float() * freqs[None]
        t = self.time(torch.cat([arg.sin(), arg.cos()], -1))
        h0 = self.a1(self.r1(self.conv_in(sample), t), encoder_hidden_states)
        h = self.a2(self.r2(self.down(h0), t), encoder_hidden_states)
        h = self.up(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(self.r3(torch.cat([h, h0], 1), t))


# ------------------------------------------------------------------------ transformers
def _hf(cls_name, config_name, keys, **cfg):
    import transformers

    def make():
        config = getattr(transformers, config_name)(**cfg)
        return getattr(transformers, cls_name)(config)

    return make, keys


def _hf_image(family, cls_name, config_name, keys, notes, size=128, calibrated=True, **cfg):
    make, keys = _hf(cls_name, config_name, keys, **cfg)

    def build():
        m = make()
        m = calibrate(m, _image_cal(size)) if calibrated else m.eval()
        return Outputs(m, keys).eval()

    return Arch(family, build, _images(size), IMG_DYN, {"batch": 3}, notes=notes)


def _text_inputs(vocab, seq=16, batch=2, mask=True):
    def inputs(dims):
        b, s = dims.get("batch", batch), dims.get("seq", seq)
        g = torch.Generator().manual_seed(3)
        out = {"input_ids": torch.randint(0, vocab, (b, s), generator=g)}
        if mask:
            m = torch.ones(b, s, dtype=torch.int64)
            m[0, s - 3:] = 0  # one padded sequence
            out["attention_mask"] = m
        return out

    return inputs


TEXT_DYN = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}


def _hf_text(family, cls_name, config_name, keys, notes, vocab=1000, mask=True, **cfg):
    make, keys = _hf(cls_name, config_name, keys, vocab_size=vocab, **cfg)

    def build():
        return Outputs(make().eval(), keys).eval()

    dyn = TEXT_DYN if mask else {"input_ids": TEXT_DYN["input_ids"]}
    return Arch(family, build, _text_inputs(vocab, mask=mask), dyn, {"batch": 3, "seq": 40},
                vocab=vocab, notes=notes)


SMALL_BERT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=128)


class DecoderWithCache(nn.Module):
    """A causal LM one decoding step: new token ids and the past keys/values of every layer
    (stacked: layers x batch x heads x past x head_dim) in, logits and the updated cache out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, past_keys, past_values):
        from transformers import DynamicCache

        cache = DynamicCache([(past_keys[i], past_values[i]) for i in range(past_keys.shape[0])],
                             config=self.model.config)
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        keys = torch.stack([layer.keys for layer in cache.layers])
        values = torch.stack([layer.values for layer in cache.layers])
        return out.logits, keys, values


def _decoder(cls_name, config_name, notes, layers=2, heads=4, kv_heads=4, head_dim=16,
             vocab=1000, **cfg):
    make, _ = _hf(cls_name, config_name, (), vocab_size=vocab, **cfg)

    def build():
        return DecoderWithCache(make().eval()).eval()

    def inputs(dims):
        b, s, p = dims.get("batch", 2), dims.get("seq", 4), dims.get("past", 12)
        g = torch.Generator().manual_seed(4)
        return {"input_ids": torch.randint(0, vocab, (b, s), generator=g),
                "past_keys": torch.randn(layers, b, kv_heads, p, head_dim, generator=g),
                "past_values": torch.randn(layers, b, kv_heads, p, head_dim, generator=g)}

    dyn = {"input_ids": {0: "batch", 1: "seq"}, "past_keys": {1: "batch", 3: "past"},
           "past_values": {1: "batch", 3: "past"}}
    return Arch("decoder (KV cache)", build, inputs, dyn, {"batch": 3, "seq": 1, "past": 37},
                vocab=vocab, notes=notes)


def _speech(cls_name, config_name, key, notes, input_name, shape_fn, dyn, check, ranges=None,
            **cfg):
    make, keys = _hf(cls_name, config_name, (key,), **cfg)

    def build():
        m = make()
        m = m.get_encoder() if hasattr(m, "get_encoder") and cls_name == "WhisperModel" else m
        return Outputs(m.eval(), keys).eval()

    def inputs(dims):
        return {input_name: torch.randn(*shape_fn(dims),
                                        generator=torch.Generator().manual_seed(5))}

    return Arch("speech", build, inputs, dyn, check, notes=notes, ranges=ranges or {})


def _sd_inputs(dims):
    g = torch.Generator().manual_seed(6)
    b = dims.get("batch", 2)
    return {"sample": torch.randn(b, 4, 16, 16, generator=g),
            "timestep": torch.tensor([10.0, 500.0, 999.0][:b] + [1.0] * max(0, b - 3)),
            "encoder_hidden_states": torch.randn(b, dims.get("ctx", 7), 48, generator=g)}


def _clip_text():
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=77)
    return Outputs(CLIPTextModel(cfg).eval(), ("last_hidden_state", "pooler_output")).eval()


def _t5_encoder():
    from transformers import T5Config, T5EncoderModel

    # eager attention: torch's dynamo ONNX exporter fails to decompose T5's SDPA call
    # ("Cannot view a tensor ... as a tensor"), which a user exporting T5 works around the same way
    cfg = T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                   attn_implementation="eager")
    return Outputs(T5EncoderModel(cfg).eval(), ("last_hidden_state",)).eval()


def _detr():
    from transformers import DetrConfig, DetrModel, ResNetConfig

    backbone = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                            layer_type="basic", out_features=["stage4"])
    cfg = DetrConfig(use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False,
                     d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                     num_queries=20)
    return calibrate(Outputs(DetrModel(cfg), ("last_hidden_state",)), _image_cal(128))


RESNET = dict(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1],
              layer_type="bottleneck")

ZOO: dict[str, Arch] = {
    # classification CNNs
    "resnet": _hf_image("classification CNN", "ResNetModel", "ResNetConfig", ("pooler_output",),
                        "bottleneck blocks, BN, max pool", **RESNET),
    "mobilenet_v2": _hf_image("classification CNN", "MobileNetV2Model", "MobileNetV2Config",
                              ("pooler_output",), "inverted residuals, ReLU6, depthwise",
                              depth_multiplier=0.35),
    "mobilenet_v3": _cnn("classification CNN", MobileNetV3Small,
                         "hard-swish, squeeze-excite with hard-sigmoid, 5x5 depthwise"),
    "efficientnet": _hf_image("classification CNN", "EfficientNetModel", "EfficientNetConfig",
                              ("pooler_output",), "MBConv, SE, SiLU, stochastic-depth-free eval",
                              width_coefficient=0.5, depth_coefficient=0.5, image_size=128,
                              hidden_dim=640),
    "densenet": _cnn("classification CNN", DenseNet, "concatenated features, BN-ReLU-Conv"),
    "inception": _cnn("classification CNN", InceptionNet,
                      "multi-branch concat, 1x7/7x1 convolutions, average pools"),
    "shufflenet_v2": _cnn("classification CNN", ShuffleNetV2,
                          "channel shuffle (reshape-transpose), chunk"),
    "regnet": _hf_image("classification CNN", "RegNetModel", "RegNetConfig", ("pooler_output",),
                        "grouped 3x3, SE (RegNetY)", embedding_size=16,
                        hidden_sizes=[24, 48, 96, 192], depths=[1, 1, 2, 1], groups_width=8,
                        layer_type="y"),
    "convnext": _hf_image("classification CNN", "ConvNextModel", "ConvNextConfig",
                          ("pooler_output",), "7x7 depthwise, LayerNorm channels-last, GELU",
                          hidden_sizes=[24, 48, 96, 192], depths=[1, 1, 2, 1]),
    "mobilevit": _hf_image("classification CNN", "MobileViTModel", "MobileViTConfig",
                           ("pooler_output",), "MobileNetV2 blocks + transformers on unfolded "
                           "patches", image_size=128, hidden_sizes=[32, 48, 64],
                           neck_hidden_sizes=[8, 16, 24, 32, 40, 48, 160]),
    # segmentation
    "unet": _cnn("segmentation", UNet, "ConvTranspose2d, bilinear Resize, skip concat; "
                 "symbolic H and W", hw=True),
    "deeplabv3": _cnn("segmentation", DeepLabV3, "dilated convolutions, ASPP with image pooling, "
                      "resize to the input's size; symbolic H and W", hw=True),
    "segformer": _hf_image("segmentation", "SegformerForSemanticSegmentation", "SegformerConfig",
                           ("logits",), "overlapping patch embed, efficient attention with "
                           "spatial reduction, Mix-FFN depthwise conv", num_encoder_blocks=2,
                           depths=[1, 1], sr_ratios=[4, 2], hidden_sizes=[16, 32],
                           num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2],
                           decoder_hidden_size=32, num_labels=5),
    # detection
    "yolov5": _cnn("detection", lambda: YOLO(False), "C3 CSP blocks, SPPF, nearest upsample, "
                   "grid decode with split"),
    "yolov8": _cnn("detection", lambda: YOLO(True), "C2f with chunk, SPPF, DFL head with split "
                   "and softmax"),
    "detr": Arch("detection", _detr, _images(128), IMG_DYN, {"batch": 3},
                 notes="ResNet backbone, sine position embedding, encoder-decoder with object "
                       "queries"),
    # transformer encoders
    "bert": _hf_text("text encoder", "BertModel", "BertConfig",
                     ("last_hidden_state", "pooler_output"), "post-LN encoder, GELU",
                     **SMALL_BERT),
    "distilbert": _hf_text("text encoder", "DistilBertModel", "DistilBertConfig",
                           ("last_hidden_state",), "6->2 layers, no token types", dim=64,
                           n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=128),
    "roberta": _hf_text("text encoder", "RobertaModel", "RobertaConfig", ("last_hidden_state",),
                        "position ids from the padding mask (cumsum)", pad_token_id=1,
                        **{**SMALL_BERT, "max_position_embeddings": 130}),
    "albert": _hf_text("text encoder", "AlbertModel", "AlbertConfig", ("last_hidden_state",),
                       "factorized embedding, one layer shared", embedding_size=32,
                       hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=128, max_position_embeddings=128),
    "t5_encoder": Arch("text encoder", _t5_encoder, _text_inputs(1000), TEXT_DYN,
                       {"batch": 3, "seq": 40}, vocab=1000,
                       notes="RMSNorm, relative position buckets (log, clamp)"),
    "clip_text": Arch("text encoder", _clip_text, _text_inputs(1000), TEXT_DYN,
                      {"batch": 3, "seq": 40}, vocab=1000, ranges={"seq": (1, 77)},
                      notes="causal mask, quick-GELU, argmax pooling"),
    # vision transformers
    "vit": _hf_image("vision transformer", "ViTModel", "ViTConfig", ("last_hidden_state",),
                     "patch embed, CLS token, pre-LN", calibrated=False, image_size=128,
                     patch_size=16, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128),
    "swin": _hf_image("vision transformer", "SwinModel", "SwinConfig", ("pooler_output",),
                      "shifted windows (roll), window partition reshapes, patch merging",
                      calibrated=False, image_size=128, embed_dim=24, depths=[2, 2],
                      num_heads=[2, 4], window_size=4,
                      attn_implementation="eager"),  # as T5: SDPA fails the dynamo exporter
    "clip_vision": _hf_image("vision transformer", "CLIPVisionModel", "CLIPVisionConfig",
                             ("pooler_output",), "pre-LN, quick-GELU, class embedding",
                             calibrated=False, image_size=128, patch_size=16, hidden_size=64,
                             intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
    "deit": _hf_image("vision transformer", "DeiTModel", "DeiTConfig", ("last_hidden_state",),
                      "CLS and distillation tokens", calibrated=False, image_size=128,
                      patch_size=16, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128),
    # speech
    "whisper_encoder": _speech("WhisperModel", "WhisperConfig", "last_hidden_state",
                               "Conv1d stem (stride 2), sinusoidal positions, pre-LN",
                               "input_features", lambda d: (d.get("batch", 2), 16, 200),
                               {"input_features": {0: "batch"}}, {"batch": 3},
                               num_mel_bins=16, d_model=64, encoder_layers=2,
                               encoder_attention_heads=4, encoder_ffn_dim=128,
                               max_source_positions=100, decoder_layers=1,
                               decoder_attention_heads=4, decoder_ffn_dim=128, vocab_size=100,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2,
                               decoder_start_token_id=1),
    "wav2vec2": _speech("Wav2Vec2Model", "Wav2Vec2Config", "last_hidden_state",
                        "strided Conv1d feature encoder with GroupNorm, grouped Conv1d "
                        "position embedding, symbolic audio length", "input_values",
                        lambda d: (d.get("batch", 2), d.get("samples", 3200)),
                        {"input_values": {0: "batch", 1: "samples"}},
                        {"batch": 3, "samples": 4800}, {"samples": (400, 32000)},
                        hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 4, 4),
                        conv_kernel=(10, 8, 4), num_conv_pos_embeddings=16,
                        num_conv_pos_embedding_groups=4, do_stable_layer_norm=False),
    # decoders with a KV cache
    "gpt2": _decoder("GPT2LMHeadModel", "GPT2Config", "learned positions offset by the past "
                     "length, Conv1D projections, causal mask over past + new tokens",
                     n_embd=64, n_layer=2, n_head=4, n_positions=128),
    "llama": _decoder("LlamaForCausalLM", "LlamaConfig", "RMSNorm, rotary embedding at the "
                      "past offset, grouped-query attention (4 heads, 2 KV heads), SiLU gate",
                      kv_heads=2, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128),
    # recurrent
    "lstm": Arch("recurrent", lambda: Tagger("LSTM").eval(), _text_inputs(500, mask=False),
                 {"input_ids": {0: "batch", 1: "seq"}}, {"batch": 3, "seq": 40}, vocab=500,
                 notes="2-layer bidirectional LSTM tagger",
                 static_in_export={"pt2": ("seq",)}),
    "gru": Arch("recurrent", lambda: Tagger("GRU").eval(), _text_inputs(500, mask=False),
                {"input_ids": {0: "batch", 1: "seq"}}, {"batch": 3, "seq": 40}, vocab=500,
                notes="2-layer bidirectional GRU tagger",
                 static_in_export={"pt2": ("seq",)}),
    # diffusion
    "sd_unet_block": Arch("diffusion", lambda: SDUNetBlock().eval(), _sd_inputs,
                          {"sample": {0: "batch"}, "timestep": {0: "batch"},
                           "encoder_hidden_states": {0: "batch", 1: "ctx"}},
                          {"batch": 3, "ctx": 11},
                          notes="GroupNorm, timestep embedding, self- and cross-attention, "
                                "GEGLU, strided down, nearest upsample"),
}


def build(name: str) -> nn.Module:
    """The architecture's module, seeded (also what the torch baseline worker calls)."""
    torch.manual_seed(0)
    return ZOO[name].build().eval()


def example(name: str, dims: dict | None = None) -> dict:
    """Example inputs (dims: sizes of the symbolic dims; default the export sizes)."""
    torch.manual_seed(1)
    return ZOO[name].inputs(dims or {})
