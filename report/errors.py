"""The report's own error type: the report never imports the runtime or its config code."""
from __future__ import annotations


class ReportError(ValueError):
    """Bad input to the report (missing or corrupt logs, bad price table); one line, no traceback."""
