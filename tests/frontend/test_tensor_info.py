"""Signatures with sizes known only at run time round-trip through the manifest's JSON."""

import json

from tvmopt.tensor_info import TensorInfo


def test_unknown_dims_and_rank_round_trip():
    infos = [TensorInfo("y", ("batch", None, 3), "float32"), TensorInfo("z", None, "int64"),
             TensorInfo("s", (), "float32")]
    back = [TensorInfo.from_json(json.loads(json.dumps(i.to_json()))) for i in infos]
    assert back == infos
    assert [i.shape_str() for i in back] == ["batchx?x3", "?", "scalar"]
    assert infos[1].to_json()["shape"] is None
