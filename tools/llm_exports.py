"""Tiny decoder LLMs exported as decoder-with-past ONNX files, named as onnxruntime-genai and
optimum name them (issue 47).

Inputs `input_ids` [batch, seq], `attention_mask` [batch, total], `position_ids` [batch, seq],
`past_key_values.{i}.key/value` [batch, kv_heads, past, head_dim]; outputs `logits`,
`present.{i}.key/value`. Models: a LLaMA with grouped-query attention and a GPT-2, both with
random weights from a fixed seed (hidden 64, 2 layers, vocab 1000), each exported by the
TorchScript exporter (dynamo=False) and by dynamo (dynamo=True) where this torch/transformers
can. Next to each FILE.onnx: FILE.prefill.npz (seq 5, past 0) and FILE.decode.npz (seq 1,
past 5; its past is the prefill's present, run in torch).

    python tools/llm_exports.py OUT_DIR [--models llama,gpt2] [--exporters torchscript,dynamo]
                                [--size tiny|small]
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings

import numpy as np

VOCAB = 1000
LAYERS = 2
# --size: "tiny" for tests; "small" the 56M-parameter LLaMA-style decoder of docs/generation.md's
# figures (hidden 512, 8 layers, 8 heads over 4 KV heads, vocab 32000)
SIZES = {"tiny": dict(hidden=64, ffn=128, layers=2, heads=4, kv_heads=2, vocab=1000, positions=256),
         "small": dict(hidden=512, ffn=1408, layers=8, heads=8, kv_heads=4, vocab=32000,
                       positions=4096)}
SIZE = SIZES["tiny"]
MODELS = ("llama", "gpt2")
EXPORTERS = ("torchscript", "dynamo")


def build(name: str):
    """A tiny random-weight decoder (fixed seed), in eval mode, and its (kv_heads, head_dim)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if name == "llama":
        cfg = LlamaConfig(hidden_size=SIZE["hidden"], intermediate_size=SIZE["ffn"],
                          num_hidden_layers=LAYERS, num_attention_heads=SIZE["heads"],
                          num_key_value_heads=SIZE["kv_heads"], vocab_size=VOCAB,
                          max_position_embeddings=SIZE["positions"], tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
        kv_heads, head_dim = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    elif name == "gpt2":
        cfg = GPT2Config(n_embd=SIZE["hidden"], n_layer=LAYERS, n_head=SIZE["heads"],
                         vocab_size=VOCAB, n_positions=SIZE["positions"], bos_token_id=0,
                         eos_token_id=0)
        model = GPT2LMHeadModel(cfg)
        kv_heads, head_dim = cfg.n_head, cfg.n_embd // cfg.n_head
    else:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return model.eval(), kv_heads, head_dim


def _wrapper(model):
    import torch
    from transformers import DynamicCache

    class DecoderWithPast(torch.nn.Module):
        """Flat tensors in and out: the past as DynamicCache, the present as its layers."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(config=self.model.config)
            for i in range(len(past) // 2):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             position_ids=position_ids, past_key_values=cache, use_cache=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return DecoderWithPast(model).eval()


def names() -> tuple[list[str], list[str]]:
    ins = ["input_ids", "attention_mask", "position_ids"]
    outs = ["logits"]
    for i in range(LAYERS):
        ins += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outs += [f"present.{i}.key", f"present.{i}.value"]
    return ins, outs


def sample(batch: int, seq: int, past: int, kv_heads: int, head_dim: int, seed: int = 0,
           past_arrays=None) -> dict[str, np.ndarray]:
    """Inputs for one step: token ids, an all-ones mask over past+seq, positions past..past+seq-1,
    and the past (random unless given)."""
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, VOCAB, (batch, seq), dtype=np.int64),
             "attention_mask": np.ones((batch, past + seq), np.int64),
             "position_ids": np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1))}
    for i in range(LAYERS):
        for kind in ("key", "value"):
            name = f"past_key_values.{i}.{kind}"
            feeds[name] = (past_arrays[name] if past_arrays is not None else
                           rng.standard_normal((batch, kv_heads, past, head_dim)).astype(np.float32))
    return feeds


def run_torch(wrapped, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch

    ins, outs = names()
    with torch.no_grad():
        got = wrapped(*[torch.from_numpy(feeds[n]) for n in ins])
    return {n: t.numpy() for n, t in zip(outs, got)}


def export(name: str, exporter: str, path: str) -> bool:
    """Export one model with one exporter to `path` (+ sample .npz files); False (with the
    reason printed) where this environment's exporter cannot."""
    import torch

    model, kv_heads, head_dim = build(name)
    wrapped = _wrapper(model)
    ins, outs = names()
    # Example sizes all distinct and > 1, so no dim is specialized to the example's value.
    example = sample(2, 3, 4, kv_heads, head_dim, seed=1)
    args = tuple(torch.from_numpy(example[n]) for n in ins)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if exporter == "torchscript":
                axes = {"input_ids": {0: "batch", 1: "seq"},
                        "attention_mask": {0: "batch", 1: "total"},
                        "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
                for i in range(LAYERS):
                    for kind in ("key", "value"):
                        axes[f"past_key_values.{i}.{kind}"] = {0: "batch", 2: "past"}
                        axes[f"present.{i}.{kind}"] = {0: "batch", 2: "total"}
                torch.onnx.export(wrapped, args, path, input_names=ins, output_names=outs,
                                  dynamic_axes=axes, opset_version=17, dynamo=False)
            elif exporter == "dynamo":
                from torch.export import Dim

                batch, seq, past, total = Dim("batch"), Dim("seq"), Dim("past"), Dim("total")
                # forward(input_ids, attention_mask, position_ids, *past): past as one tuple
                shapes = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq},
                          tuple({0: batch, 2: past} for _ in range(2 * LAYERS)))
                torch.onnx.export(wrapped, args, path, input_names=ins, output_names=outs,
                                  dynamic_shapes=shapes, opset_version=18, dynamo=True,
                                  external_data=False, verbose=False)
            else:
                raise ValueError(f"unknown exporter {exporter!r}; known: {', '.join(EXPORTERS)}")
    except Exception as err:  # any exporter failure is reported and the next export goes on
        line = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        print(f"{name}/{exporter}: cannot export here: {line}", file=sys.stderr)
        if os.environ.get("LLM_EXPORTS_TRACEBACK"):
            traceback.print_exc()
        return False
    base = path[:-len(".onnx")]
    prefill = sample(1, 5, 0, kv_heads, head_dim, seed=2)
    np.savez(base + ".prefill.npz", **prefill)
    present = run_torch(wrapped, prefill)
    decode = sample(1, 1, 5, kv_heads, head_dim, seed=3,
                    past_arrays={f"past_key_values.{i}.{k}": present[f"present.{i}.{k}"]
                                 for i in range(LAYERS) for k in ("key", "value")})
    np.savez(base + ".decode.npz", **decode)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--exporters", default=",".join(EXPORTERS))
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    a = ap.parse_args(argv)
    global SIZE, LAYERS, VOCAB
    SIZE = SIZES[a.size]
    LAYERS, VOCAB = SIZE["layers"], SIZE["vocab"]
    os.makedirs(a.out_dir, exist_ok=True)
    for name in a.models.split(","):
        for exporter in a.exporters.split(","):
            path = os.path.join(a.out_dir, f"{name}_{exporter}.onnx")
            if export(name, exporter, path):
                print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
