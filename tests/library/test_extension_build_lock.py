"""The oneDNN extension is built once when several processes ask for it at the same time."""

from __future__ import annotations

import threading
import time

from tvmopt.library.onednn import extension


def test_concurrent_builds_build_once_and_all_see_the_library(tmp_path, monkeypatch):
    calls = []

    def slow_build(name, sources, extra_cflags, extra_ldflags, extra_include_paths,
                   build_directory):
        calls.append(build_directory)
        time.sleep(0.3)  # long enough for the other caller to arrive mid-build
        out = f"{build_directory}/{name}.so"
        with open(out, "w") as f:
            f.write("library")
        return out

    monkeypatch.setattr(extension.tvm_ffi.cpp, "build", slow_build)
    monkeypatch.setattr(extension, "find_onednn", lambda root=None: (tmp_path, tmp_path))
    monkeypatch.setattr(extension, "_threading_runtime", lambda inc: "OMP")
    monkeypatch.setattr(extension, "_onednn_version", lambda inc: "test")
    got = []
    workers = [threading.Thread(target=lambda: got.append(extension.build_extension(tmp_path)))
               for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(calls) == 1
    assert len(set(got)) == 1 and open(got[0]).read() == "library"
