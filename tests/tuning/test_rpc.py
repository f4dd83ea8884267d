"""RPC: a tracker and two servers on loopback, a tiny workload tuned through them."""

from __future__ import annotations


import pytest

from tests.models import tiny_mlp

from tests.harness import loopback_rpc_farm
from tvmopt import errors
from tvmopt.tuning import database, measure, tune


@pytest.fixture
def farm():
    """Tracker + two servers on 127.0.0.1, random free ports; all terminated afterwards."""
    with loopback_rpc_farm("tvmopt-test", 2, timeout_s=30) as addr:
        yield addr


@pytest.mark.slow  # about a minute alone, several on busy cores
def test_tune_through_rpc_tracker(farm, tmp_path):
    model = tiny_mlp(tmp_path / "mlp.onnx")
    result = tune.tune(tune.TuneOptions(
        model=model, trials=8, db=str(tmp_path / "db"), shapes={"x": (1, 32)},
        rpc_tracker=farm, rpc_key="tvmopt-test", trials_per_round=4, population=32))
    assert result.trials_run == 8
    assert result.build_failures == 0 and result.run_failures == 0
    assert all(t.best_s is not None for t in result.tasks)
    manifest = database.read_manifest(tmp_path / "db")
    assert manifest["rpc"] == {"tracker": farm, "key": "tvmopt-test"}


def test_rpc_key_is_required_with_tracker():
    with pytest.raises(errors.TuningError, match="--rpc-key"):
        measure.make_runner("127.0.0.1:9190", None)
