"""The rich console the command-line tools print their tables to.

rich folds tables to 80 columns when stdout is not a terminal, which breaks GPU
names and headers over several lines in logs and pipes; piped output (no
terminal, no ``COLUMNS``) gets a wide fixed width instead.
"""
from __future__ import annotations

import os
import sys

PIPE_WIDTH = 160


def cli_console():
    """A rich Console: the terminal's width, or ``PIPE_WIDTH`` columns when piped. A reader that went
    away (``| head``) raises BrokenPipeError, which the CLI turns into exit status 141 like its plain
    prints; rich's own handling would exit with status 1."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return PipeConsole(width=PIPE_WIDTH if piped else None)


def prefix_notices() -> None:
    """Print the ``geodiloco.*`` loggers' warnings (an unknown GPU's stand-in, a balancing option the policy
    never reads, fragments nothing sends) as ``[geodiloco] ...`` lines on stderr, like the runtime's own
    notices; without a handler, logging's last resort prints them bare. Called by the command-line entry
    points, not on import: a program that uses the package keeps its own logging setup."""
    import logging

    package_log = logging.getLogger("geodiloco")
    if package_log.handlers:
        return
    class CurrentStderr(logging.StreamHandler):
        """Writes to ``sys.stderr`` as it is when a notice comes, not as it was when the handler was made."""

        @property
        def stream(self):
            return sys.stderr

        @stream.setter
        def stream(self, _value) -> None:
            pass

    handler = CurrentStderr()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("[geodiloco] %(message)s"))
    package_log.addHandler(handler)
