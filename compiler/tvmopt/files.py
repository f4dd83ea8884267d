"""File helpers every layer shares: tvmopt's cache folder and a file's sha256.

Imports nothing from tvmopt, so any module may use it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """tvmopt's cache folder, which holds built extensions, timing caches and edge runtimes.

    Returns:
        $TVMOPT_CACHE_DIR, or ~/.cache/tvmopt when that variable is unset or empty (an empty
        value would otherwise mean the current directory).
    """
    env = os.environ.get("TVMOPT_CACHE_DIR")
    return Path(env) if env else Path("~/.cache/tvmopt").expanduser()


def sha256_file(path: str | os.PathLike) -> str:
    """The hex sha256 of a file's bytes, read in chunks so large weights fit in memory.

    Args:
        path: The file.

    Returns:
        The 64-character lowercase hex digest.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
