"""Domain errors. The CLI turns every TvmoptError into one line on stderr and exit code 1."""


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


class TuningError(TvmoptError):
    """Tuning could not start or continue (locked database, no tasks, bad database)."""
