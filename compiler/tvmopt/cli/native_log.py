"""TVM's C++ log lines kept off the terminal unless asked for (`-v` or TVMOPT_DEBUG=1).

TVM's C++ (and that of tools it runs) writes to file descriptor 2 directly, so Python-level
redirection cannot catch it ("[00:13:40] /project/include/tvm/topi/transform.h:1261: Warning:
Fast mode segfaults ..." dozens of times per compile, "BlockBuilder destroyed with remaining
blocks!" after a failed import). While a command runs, fd 2 is a pipe read by a thread that
drops lines in TVM's log format and passes every other line on; Python's own sys.stderr is
pointed at the real stderr, so tvmopt's messages and progress bypass the filter and still see
the terminal.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

# dmlc/TVM logging: "[HH:MM:SS] path/to/file.cc:LINE: " then the message
NATIVE_LOG_LINE = re.compile(rb"^\[\d{2}:\d{2}:\d{2}\] \S+:\d+: ")


class _Dropper:
    """Which lines to drop: TVM's log lines, and the indented lines that continue one (a
    message with newlines in it, as MetaSchedule's "Unknown schedule rule ... Checked
    ffi::Functions:" followed by "  s_tir.meta_schedule.cpu....")."""

    def __init__(self):
        self.in_message = False

    def drop(self, line: bytes) -> bool:
        if NATIVE_LOG_LINE.match(line):
            self.in_message = True
        elif not (self.in_message and line[:1] in (b" ", b"\t")):
            self.in_message = False
        return self.in_message


def _pump(read_fd: int, write_fd: int) -> None:
    pending = b""
    dropper = _Dropper()
    with os.fdopen(read_fd, "rb", buffering=0) as src:
        while True:
            try:
                chunk = src.read(65536)
            except OSError:
                break
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            out = b"".join(line + b"\n" for line in lines if not dropper.drop(line))
            if out:
                os.write(write_fd, out)
    if pending and not dropper.drop(pending):
        os.write(write_fd, pending)


def _real_stderr() -> bool:
    """Whether sys.stderr is the process's fd 2 (not a test runner's capture)."""
    try:
        return sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False


@contextlib.contextmanager
def filtered(enabled: bool = True):
    """Drop TVM's native log lines from fd 2 for the duration; a no-op when not `enabled` or
    when stderr is not fd 2."""
    if not enabled or not _real_stderr():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    old_stderr = sys.stderr
    sys.stderr = open(os.dup(saved), "w", buffering=1, encoding=old_stderr.encoding,
                      errors=old_stderr.errors, closefd=True)
    pump = threading.Thread(target=_pump, args=(read_fd, saved), daemon=True,
                            name="tvmopt-native-log")
    pump.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        # restoring fd 2 closes the pipe's last writer in this process: the pump sees EOF once
        # child processes that inherited it (compilers, tuning workers) are gone too
        os.dup2(saved, 2)
        pump.join(timeout=2.0)
        sys.stderr.close()
        sys.stderr = old_stderr
        if not pump.is_alive():
            os.close(saved)
