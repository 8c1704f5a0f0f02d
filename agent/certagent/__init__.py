"""certagent: lazy-loads TLS certificates into HAProxy through its runtime API."""

from importlib import metadata

try:
    # the installed package's version (pyproject.toml's), as `certagent --version` prints it
    __version__ = metadata.version("certagent")
except metadata.PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
    __version__ = "0+unknown"
