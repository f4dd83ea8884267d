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


def _calibrated(model):
    """Batch norms of unit scale whose statistics are measured on random images, as training
    leaves them: each norm's output near unit variance. With the library's init (scales and
    weights std 0.02, running variance 1) activations shrink block by block to denormals and
    exact zeros: an all-0 output verifies nothing, and denormal arithmetic is not what a
    trained model times."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
            m.reset_running_stats()
            m.momentum = None  # a plain average over the calibration batch
    model.train()
    with torch.no_grad():
        model(torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(2)))
    return model.eval()


def _efficientnet_b0():
    from transformers import EfficientNetConfig, EfficientNetModel

    # The library's default config is B7 (width 2.0, depth 3.1, 600 px): B0's coefficients.
    cfg = EfficientNetConfig(width_coefficient=1.0, depth_coefficient=1.0, image_size=224,
                             hidden_dim=1280, dropout_rate=0.2)
    return _calibrated(EfficientNetModel(cfg)), "pooler_output"  # MBConv, SE, SiLU


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


def _efficientnet_b7():
    from transformers import EfficientNetConfig, EfficientNetModel

    # B7 (width 2.0, depth 3.1), run at 224 px
    return _calibrated(EfficientNetModel(EfficientNetConfig())), "pooler_output"


def _swin_tiny():
    from transformers import SwinConfig, SwinModel

    return SwinModel(SwinConfig()), "pooler_output"  # Swin-T: shifted 7x7 windows, 49 tokens


def _mobilevit_small():
    from transformers import MobileViTConfig, MobileViTModel

    # MobileViT-S: MobileNetV2 blocks, transformers over unfolded patches, SiLU
    return _calibrated(MobileViTModel(MobileViTConfig())), "pooler_output"


def _llama():
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=8, vocab_size=32000)
    return LlamaModel(cfg), "last_hidden_state"  # RMSNorm, rotary, SiLU-gated MLP, causal


MODELS = {
    "resnet50": (_resnet50, "image"),
    "efficientnet_b0": (_efficientnet_b0, "image"),
    "efficientnet_b7": (_efficientnet_b7, "image"),
    "convnext_tiny": (_convnext_tiny, "image"),
    "vit_small": (_vit_small, "image"),
    "distilbert": (_distilbert, "text"),
    "swin_tiny": (_swin_tiny, "image"),
    "mobilevit_small": (_mobilevit_small, "image"),
    "llama": (_llama, "text"),
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
