"""The ``evalrun`` command line."""

from evalrun.cli.main import main

__all__ = ["main"]
