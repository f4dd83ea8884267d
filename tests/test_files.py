"""The cache root every cache shares, and the one file sha256."""

import hashlib
from pathlib import Path

from tvmopt.files import cache_root, sha256_file


def test_cache_root_reads_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"


def test_an_unset_or_empty_variable_means_the_default(monkeypatch):
    default = Path("~/.cache/tvmopt").expanduser()
    monkeypatch.delenv("TVMOPT_CACHE_DIR", raising=False)
    assert cache_root() == default
    monkeypatch.setenv("TVMOPT_CACHE_DIR", "")
    assert cache_root() == default


def test_every_cache_uses_the_root(monkeypatch, tmp_path):
    from tvmopt.precision.choice import TimingCache

    monkeypatch.setenv("TVMOPT_CACHE_DIR", str(tmp_path))
    assert TimingCache().path.parent == tmp_path


def test_sha256_file_reads_past_one_chunk(tmp_path):
    data = bytes(range(256)) * 5000  # more than one 1 MiB read
    p = tmp_path / "blob"
    p.write_bytes(data)
    assert sha256_file(p) == sha256_file(str(p)) == hashlib.sha256(data).hexdigest()
