"""``python -m remediator.cli``: the same command line as ``remediator``."""

from remediator.cli import main

main(prog_name="remediator")
