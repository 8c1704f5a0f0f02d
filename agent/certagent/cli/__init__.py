"""The `certagent` command line: init, run, check, status, cert, keys, token."""

from certagent.cli.commands import main

__all__ = ["main"]
