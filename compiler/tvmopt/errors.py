"""Domain errors. The CLI turns every TvmoptError into one line on stderr and exit code 1."""

import re


class TvmoptError(Exception):
    """Base class for errors the user can act on."""

    hint: str | None = None

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        if hint:
            self.hint = hint


class ModelError(TvmoptError):
    """The model file is missing, unreadable or not valid ONNX."""


class UnsupportedOpError(TvmoptError):
    """The importer has no converter for one or more op types."""


class ImportFailure(TvmoptError):
    """A node failed to convert, or the imported graph is not usable."""


class ShapeError(TvmoptError):
    """A dimension is unknown, or a tensor's shape or dtype does not match."""


class TargetError(TvmoptError):
    """Unknown target, or an artifact built for a target this host cannot run."""


class ArtifactError(TvmoptError):
    """An artifact is missing files, tampered with, or from an incompatible version."""


class VerificationError(TvmoptError):
    """Outputs differ from the reference beyond tolerance."""


class BuildError(TvmoptError):
    """TVM failed to compile the module."""


class RunError(TvmoptError):
    """A loaded artifact failed while running on the given inputs (a run-time check or kernel)."""


class InputValueError(RunError):
    """A value inside a request (an index, a size read from an input) is out of range: the run
    is refused before any kernel reads or writes with it; the artifact answers the next call."""


class TuningError(TvmoptError):
    """Tuning could not start or continue (locked database, no tasks, bad database)."""


# A line that names the failure: "ValueError: ...", "tvm.error.InternalError: ...", or TVM's
# "Check failed: ..." (with or without a "[time] file.cc:line:" prefix).
_MESSAGE = re.compile(r"^[\w.]*(Error|Exception|Failure):\s*\S|Check failed")
# A line that carries no message: a traceback frame (Python's or TVM's numbered C++ frames),
# a caret underline, or a TVMScript comment such as "# Metadata omitted. Use show_meta=True...".
_NOISE = re.compile(r'^(Traceback \(most recent call last\)|File "|\d+: |#|[\^~]+$)')
# The first line of an IR dump appended to a message; everything from here on is the dump.
_IR_DUMP = re.compile(r"^(@[IRT]\.|class Module\b|def \w+\(|# from tvm\.script)")


def error_line(err: BaseException | str, default: str | None = None) -> str:
    """The most informative single line of an error's text.

    TVM errors carry their message on one line and may add traceback frames before it or an IR
    dump after it (which often ends with "# Metadata omitted..."); neither the first nor the last
    line is reliably the message, so this picks it out.

    Args:
        err: The exception, or an error text such as a subprocess's stderr.
        default: What to return when the text has no usable line; the exception's type name
            when `err` is an exception and `default` is None.

    Returns:
        The last line that names a failure ("XError: ...", "Check failed ..."); failing that,
        the first line before any IR dump that is not a traceback frame or script comment;
        failing that, `default`.
    """
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    named = [ln for ln in lines if _MESSAGE.search(ln)]
    if named:
        return named[-1]
    for ln in lines:
        if _IR_DUMP.match(ln):
            break
        if not _NOISE.match(ln):
            return ln
    if default is None:
        default = type(err).__name__ if isinstance(err, BaseException) else ""
    return default


def last_line(text: str, default: str) -> str:
    """The last non-blank line of a process's output (where its final complaint goes).

    Args:
        text: Output text, typically a subprocess's stderr.
        default: What to return when `text` has no non-blank line.

    Returns:
        The line, stripped, or `default`.
    """
    return (text.strip().splitlines() or [default])[-1].strip()
