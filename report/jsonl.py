"""Read a JSON Lines log, tolerating the half-written last line of a crashed run."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from geodiloco.report.errors import ReportError

Line = TypeVar("Line", bound=BaseModel)


def _describe(err: ValidationError) -> str:
    problems = []
    for problem in err.errors():
        where = ".".join(str(part) for part in problem["loc"]) or "record"
        message = problem["msg"]
        if problem["type"] != "missing" and "input" in problem and not isinstance(problem["input"], (dict, list)):
            message = f"{message} (got {problem['input']!r})"
        problems.append(f"{where}: {message}")
    return "; ".join(problems)


def _numbered_lines(path: Path) -> list[tuple[int, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not a UTF-8 text file; expected JSON Lines") from None
    except OSError as err:
        raise ReportError(f"{path}: cannot read: {err.strerror}") from None
    return [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]


def read_jsonl(path: Path, schema: type[Line], warnings: list[str]) -> list[Line]:
    """Parse every line of ``path`` into ``schema``.

    A last line that is not valid JSON is what a crash mid-write leaves: it is
    skipped and a warning is appended to ``warnings``. Any other bad line is a
    ReportError naming the file, the line number and the field.
    """
    lines = _numbered_lines(path)
    parsed: list[Line] = []
    for index, (number, text) in enumerate(lines):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            if index == len(lines) - 1:
                warnings.append(f"{path.name} line {number}: truncated last record skipped (a crash while writing?)")
                continue
            raise ReportError(f"{path} line {number}: not valid JSON ({err.msg}); only the last line may be truncated") from None
        if not isinstance(data, dict):
            raise ReportError(f"{path} line {number}: expected a JSON object, got {type(data).__name__}")
        try:
            parsed.append(schema.model_validate(data))
        except ValidationError as err:
            raise ReportError(f"{path} line {number}: {_describe(err)}") from None
    return parsed
