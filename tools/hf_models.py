"""Published architectures from `transformers`, built from their configs with random weights.

The untuned-speed targets must hold on models tvmopt was never written against. These are the
upstream implementations (nothing downloaded: each model is built from its library config,
the standard size unless noted, random weights, fixed seed), exported like tools/torch_models.py
with torch.onnx.export at opset 17. Vision models take 1x3x224x224 per image; text models take
128 token ids per sequence. Used by `tools/bench_default.py --models hf:resnet50,...`.
"""

from __future__ import annotations

import torch
from torch import nn


class _LastHidden(nn.Module):
    """The model's main output as one tensor (ModelOutput dicts export as several)."""

    def __init__(self, model, key):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x):
        return getattr(self.model(x), self.key)


def _resnet50():
    from transformers import ResNetConfig, ResNetModel

    return ResNetModel(ResNetConfig()), "pooler_output"  # ResNet-50 (bottleneck, depths 3-4-6-3)


def _efficientnet_b0():
    from transformers import EfficientNetConfig, EfficientNetModel

    return EfficientNetModel(EfficientNetConfig()), "pooler_output"  # B0: MBConv, SE, SiLU


def _convnext_tiny():
    from transformers import ConvNextConfig, ConvNextModel

    return ConvNextModel(ConvNextConfig()), "pooler_output"  # 7x7 depthwise, LayerNorm, GELU


def _vit_small():
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                    intermediate_size=1536)  # ViT-S/16
    return ViTModel(cfg, add_pooling_layer=False), "last_hidden_state"


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    return DistilBertModel(DistilBertConfig()), "last_hidden_state"  # 6 layers, hidden 768


MODELS = {
    "resnet50": (_resnet50, "image"),
    "efficientnet_b0": (_efficientnet_b0, "image"),
    "convnext_tiny": (_convnext_tiny, "image"),
    "vit_small": (_vit_small, "image"),
    "distilbert": (_distilbert, "text"),
}


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    model, key = MODELS[name][0]()
    return _LastHidden(model.eval(), key).eval()


def example(name: str, batch: int) -> torch.Tensor:
    torch.manual_seed(1)
    if MODELS[name][1] == "image":
        return torch.randn(batch, 3, 224, 224)
    return torch.randint(0, 30000, (batch, 128))


def export(name: str, out_dir: str, batch: int = 1) -> str:
    from torch_models import export_onnx  # a sibling in tools/, on sys.path when run from there

    return export_onnx(build, example, name, out_dir, batch, prefix="hf_")
