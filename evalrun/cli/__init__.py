"""The ``evalrun`` command line: ``main(argv) -> int`` runs one command; ``cli`` is the click group."""

from evalrun.cli.main import cli, main

__all__ = ["cli", "main"]
