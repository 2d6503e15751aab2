"""The command line: thin click commands over the use cases; the only layer that prints."""

from hetsched.cli.main import main

__all__ = ["main"]
