"""The model zoo (tools/zoo.py) through the product path: export, `compile_model` (fp32),
`load`, `run` at the export sizes and at other sizes of every symbolic dim, compared with
onnxruntime (torch for a .pt2).

Default tier: one small architecture per family, TorchScript exporter, each chosen for what it
exercises (symbolic image sizes through Resize and Concat, a Range over symbolic dims, a
convolution output length as a symbolic extent, a KV cache, a fused boolean mask). Slow tier:
a subset of the whole zoo (architecture x exporter) that rotates daily, so every entry is
compiled again over time; TVMOPT_ZOO_ENTRIES=name:exporter,... pins it.
"""

from __future__ import annotations

import datetime
import os
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tools import zoo  # noqa: E402
import zoo_models  # noqa: E402 - on sys.path once tools.zoo is imported

# family -> the architecture the default tier compiles for it
FAMILY_REPRESENTATIVES = {
    "classification CNN": "mobilenet_v3",  # hard-swish, squeeze-excite
    "segmentation": "deeplabv3",  # symbolic H/W: dilated convs, Resize to a symbolic size
    "detection": "detr",  # Tile by a shape-derived count, a boolean mask beside a matmul
    "text encoder": "bert",  # symbolic batch and sequence: Range over them
    "vision transformer": "vit",
    "speech": "wav2vec2",  # convolution output lengths as symbolic extents, 2 threads
    "decoder (KV cache)": "gpt2",  # past length symbolic, one new token checked
    "diffusion": "sd_unet_block",
    "recurrent": "lstm",  # a symbolic sequence length: the loop kernel (codegen dispatch)
}


def _args(tmp_path, **kw):
    return types.SimpleNamespace(**{"out": str(tmp_path), "target": "host",
                                    "dispatch": "codegen", "threads": 2, "runs": 3,
                                    "no_time": True, **kw})


def test_every_family_has_a_representative():
    families = {a.family for a in zoo_models.ZOO.values()}
    assert families == set(FAMILY_REPRESENTATIVES)
    assert all(zoo_models.ZOO[n].family == f for f, n in FAMILY_REPRESENTATIVES.items())
    assert len(zoo_models.ZOO) >= 30


# The longest families run in the slow tier: recurrent layers, CNNs, detectors (chunk) and
# the diffusion UNet (ConvTranspose) have cheaper tests of their own in the default one.
_SLOW_FAMILIES = {"recurrent", "classification CNN", "detection", "diffusion"}


@pytest.mark.parametrize("family", [
    pytest.param(f, marks=[pytest.mark.slow] if f in _SLOW_FAMILIES else [])
    for f in sorted(FAMILY_REPRESENTATIVES)])
def test_family_compiles_and_verifies(family, tmp_path, monkeypatch):
    # Two worker threads: a kernel whose tiles raced showed only with more than one.
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    name = FAMILY_REPRESENTATIVES[family]
    row = zoo.run_one(name, "torchscript", _args(tmp_path))
    assert row["status"] == "verified", row
    assert row["max_rel_err"] < 1e-4
    assert row["checked_dims"] == [zoo_models.ZOO[name].check]


def test_markdown_table_from_results():
    results = {"host": {"cpu": "cpu", "cores": 2, "features": ["avx2"]}, "threads": 2, "rows": {
        "bert:torchscript": {"arch": "bert", "family": "text encoder", "exporter": "torchscript",
                             "status": "verified", "max_rel_err": 3e-7, "compile_s": 4.2,
                             "ms": {"tvmopt": 2.0, "onnxruntime": 1.0}, "baseline": "onnxruntime",
                             "ratio": 2.0},
        "lstm:torchscript": {"arch": "lstm", "family": "recurrent", "exporter": "torchscript",
                             "status": "refused", "message": "node 'x' (LSTM): a | b"}}}
    md = zoo.markdown(results)
    assert "| bert | text encoder | torchscript | verified (3e-07) | 2.00 ms | 1.00 ms " \
           "(onnxruntime) | 2.00x | 4 s |" in md
    assert "refused: node 'x' (LSTM): a \\| b" in md
    assert "1 of 2 entries compiled and verified (50%)" in md


def _rotating_entries(k=6):
    pinned = os.environ.get("TVMOPT_ZOO_ENTRIES")
    if pinned:
        return [tuple(e.split(":")) for e in pinned.split(",")]
    entries = [(n, e) for n in sorted(zoo_models.ZOO) for e in zoo.EXPORTERS]
    start = (datetime.date.today().toordinal() * k) % len(entries)
    return [entries[(start + i) % len(entries)] for i in range(k)]


@pytest.mark.slow
@pytest.mark.parametrize("name,exporter", _rotating_entries())
def test_zoo_entry(name, exporter, tmp_path):
    row = zoo.run_one(name, exporter, _args(tmp_path, dispatch=None))
    if row["status"] == "export failed":
        pytest.skip(f"torch cannot export it: {row['message']}")
    # Verified, or refused in one line naming what is not supported: never an internal error.
    assert row["status"] in ("verified", "refused"), row
    assert "\n" not in row.get("message", "")
