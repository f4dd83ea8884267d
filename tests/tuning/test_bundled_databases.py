"""CI replay: every bundled model compiles from its committed x86 database with --require-db
(any miss fails) and matches onnxruntime. Nothing is tuned here."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tvmopt.cli.main import main
from tvmopt.models import bundled
from tvmopt.tuning.database import MANIFEST_FILE, bundled_db_dir

TARGET = "x86-avx2"
# Bundled models the importer cannot take yet, so no database can exist for them (none now).
NOT_IMPORTABLE: dict[str, str] = {}


def _committed():
    out = []
    for name in bundled():
        marks = [pytest.mark.skip(reason=NOT_IMPORTABLE[name])] if name in NOT_IMPORTABLE else []
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def test_every_importable_bundled_model_has_a_database():
    missing = [n for n in bundled() if n not in NOT_IMPORTABLE
               and not (bundled_db_dir(n, TARGET) / MANIFEST_FILE).exists()]
    assert missing == []


@pytest.mark.parametrize("name", _committed())
def test_committed_database_replays_fully_and_matches_onnxruntime(name, tmp_path):
    db = bundled_db_dir(name, TARGET)
    manifest = json.loads((db / MANIFEST_FILE).read_text())
    assert manifest["target"]["name"] == TARGET
    shapes = [f"{k}={'x'.join(map(str, v))}" for k, v in manifest["shapes"].items()]
    assert shapes, "committed databases are tuned at fixed shapes (--shape)"
    # Tuned on the module compile builds by default: nothing is switched off to replay them.
    assert manifest["pipeline"]["layout"] == "NHWC" and manifest["dispatch"] == "auto"
    assert all(d["committed"] for d in manifest["defaults"].values()), manifest["defaults"]
    out = tmp_path / f"{name}.tvmopt"
    args = ["compile", str(bundled()[name]), "--target", TARGET, "--db", str(db),
            "--require-db", "--verify", "-o", str(out)]
    for s in shapes:
        args += ["--shape", s]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    tuning = json.loads((out / "manifest.json").read_text())["tuning"]
    assert tuning["hit_rate"] == 1.0 and tuning["misses"] == []
    assert not any(c.startswith("layout") for c in tuning["option_changes"])
    assert tuning["skipped_lines"] == 0
