"""The `tvmopt` command group and its error policy; each command lives in its own module.

A command parses -> builds options -> calls the Python API -> prints.

TVM is imported inside commands so `tvmopt --help` stays instant. Every TvmoptError becomes one
line on stderr and exit code 1; set TVMOPT_DEBUG=1 to see tracebacks. TVM's native log lines are
dropped from stderr unless `-v` or TVMOPT_DEBUG=1 (native_log.py); each step shows on one
progress line when stderr is a terminal (progress.py).
"""

from __future__ import annotations

import os
import sys

import click

from ..errors import TvmoptError, error_line


def _fail(msg: str, code: int = 1):
    click.echo(f"tvmopt: error: {msg}", err=True)
    sys.exit(code)


class _Group(click.Group):
    """Turns domain errors into one line, and any other exception into one line too."""

    def invoke(self, ctx):
        from ..console import err_console
        from . import native_log, progress

        debug = bool(os.environ.get("TVMOPT_DEBUG"))
        verbose = debug or bool(ctx.params.get("verbose"))
        try:
            with native_log.filtered(enabled=not verbose), progress.shown(err_console):
                return super().invoke(ctx)
        except TvmoptError as err:
            if os.environ.get("TVMOPT_DEBUG"):
                raise
            msg = str(err)
            if err.hint:
                msg += f" ({err.hint})"
            _fail(msg)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Exception as err:  # an unexpected failure still gets one line, not a traceback
            if os.environ.get("TVMOPT_DEBUG"):
                raise
            text = error_line(err, "")
            _fail(f"internal error: {type(err).__name__}: {text} "
                  "(set TVMOPT_DEBUG=1 for the traceback, TVMOPT_SAVE_TEMPS=DIR for the IR)", 2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tvmopt")
@click.option("-v", "--verbose", is_flag=True,
              help="Show TVM's own (C++) log lines on stderr; TVMOPT_DEBUG=1 shows them too.")
def main(verbose):
    """tvmopt: compile ONNX models and torch.export programs with Apache TVM (Relax), tuned
    and verified per target."""


# Registered here, so command modules never import this one (nor each other).
from . import bench, compare, compile, db, demo, inspect, plan, rpc, run, targets, tune  # noqa: E402

for _module in (inspect, compile, run, targets, demo, plan, tune, db, rpc, bench, compare):
    main.add_command(getattr(_module, _module.__name__.rsplit(".", 1)[1]))

if __name__ == "__main__":
    main()
