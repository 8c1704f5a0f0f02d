"""The `certagent` command line: init, run, check, status, cert, keys, domain, token."""

from certagent.cli.commands import main

__all__ = ["main"]
