"""`python -m tvmopt.cli`: the same as the `tvmopt` command."""

from .main import main

main(prog_name="tvmopt")
