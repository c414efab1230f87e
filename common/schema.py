"""Validation shared by every config file the project reads.

Lives in common/, below every other package, so predictor, balancer, lab and runtime all build on it.
Errors name the file, the field path and how to fix it, in one line per error.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator


class StrictModel(BaseModel):
    """Config section: unknown keys are errors, values are validated on assignment, numbers are finite (an
    infinite step time or round budget planned inf and nan seconds), and a number is not a boolean (pydantic
    reads ``true`` as 1, so ``rounds: true`` ran one round)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and _takes_numbers_not_booleans(cls.model_fields[info.field_name].annotation):
            raise ValueError("expected a number, not a boolean")
        return value


def _takes_numbers_not_booleans(annotation: Any) -> bool:
    """Whether a field's annotation (``int``, ``Optional[float]``, ``Union[int, str]``, ...) holds numbers and no bool."""
    leaves, pending = set(), [annotation]
    while pending:
        item = pending.pop()
        arguments = get_args(item)
        if arguments:
            pending.extend(arguments)
        else:
            leaves.add(item)
    return bool(leaves & {int, float}) and bool not in leaves


class ConfigError(ValueError):
    """A config file or value is wrong; the message names the field and the fix."""


def _field_path(loc: tuple) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def _model_in(annotation: Any) -> Optional[type[BaseModel]]:
    """The config model inside a field's annotation (``X``, ``Optional[X]``, ``list[X]``), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation):
        found = _model_in(argument)
        if found is not None:
            return found
    return None


def section_keys(model: Optional[type[BaseModel]], section: tuple) -> list[str]:
    """The keys the config section at ``section`` (a pydantic error location) accepts; [] when unknown."""
    current = model
    for part in section:
        if current is None:
            return []
        if isinstance(part, int):
            continue  # an item of a list: its model is the list's
        field = current.model_fields.get(str(part))
        current = _model_in(field.annotation) if field is not None else None
    return list(current.model_fields) if current is not None else []


def misspelt_keys(problems: list[dict], missing: set[tuple],
                  model: Optional[type[BaseModel]] = None) -> dict[tuple, str]:
    """{location of an unknown key: the key it likely misspells}: a ``missing`` required key of its section
    first, else any key the section accepts."""
    import difflib
    meant = {}
    for problem in problems:
        if problem["type"] == "extra_forbidden" and problem["loc"]:
            section, key = tuple(problem["loc"][:-1]), str(problem["loc"][-1])
            missing_here = [name for where, name in missing if where == section]
            close = (difflib.get_close_matches(key, missing_here, n=1, cutoff=0.75)
                     or difflib.get_close_matches(key, section_keys(model, section), n=1, cutoff=0.75))
            if close:
                meant[tuple(problem["loc"])] = close[0]
    return meant


def missing_keys(problems: list[dict]) -> set[tuple]:
    return {(tuple(problem["loc"][:-1]), str(problem["loc"][-1])) for problem in problems
            if problem["type"] == "missing" and problem["loc"]}


def format_validation_error(err: ValidationError, source: str, prefix: str = "",
                            model: Optional[type[BaseModel]] = None) -> str:
    """One line per problem: ``source: field.path: what is wrong (got X)``. An unknown key that misspells a
    missing required one says so (and the missing one is not listed again)."""
    lines = []
    problems = err.errors()
    missing = missing_keys(problems)
    meant = misspelt_keys(problems, missing, model)
    named = {(location[:-1], key) for location, key in meant.items()}
    for problem in problems:
        if problem["type"] == "missing" and (tuple(problem["loc"][:-1]), problem["loc"][-1]) in named:
            continue
        path = _field_path(tuple(prefix.split(".")) + problem["loc"] if prefix else problem["loc"])
        # a validator's own sentence, not pydantic's label; one that names its field already is not prefixed twice
        message = problem["msg"].removeprefix("Value error, ").removeprefix(f"{path}: ")
        if tuple(problem["loc"]) in meant:
            key = meant[tuple(problem["loc"])]
            required = " (required, and missing)" if (tuple(problem["loc"][:-1]), key) in missing else ""
            message = f"unknown key; did you mean {key!r}{required}?"
        elif problem["type"] == "extra_forbidden":
            message = "unknown key; remove it or check its spelling against the documented keys"
        elif "input" in problem and not isinstance(problem["input"], (dict, list)):
            message = f"{message} (got {problem['input']!r})"
        names_its_field = problem["type"] == "value_error" and (path == "(top level)" or message.startswith(f"{path}."))
        lines.append(f"{source}: {message}" if names_its_field else f"{source}: {path}: {message}")
    return "\n".join(lines)


def with_options(source: str, options: list[str]) -> str:
    """``source`` (a config file) and the command-line options that changed it, so that an error in an
    option's value does not send the user looking for it in the file."""
    return f"{source} (with {', '.join(options)})" if options else source


class DuplicateKey(yaml.YAMLError):
    """A mapping that writes one key twice (the message says where)."""


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key written twice in one mapping: PyYAML keeps the last silently, so
    a second ``nodes:`` list dropped the first one's nodes from a plan without a word."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise DuplicateKey(f"line {key_node.start_mark.line + 1}: {key!r} is written twice (first on line "
                                   f"{seen[key] + 1}); a mapping holds each key once, so one of them would be lost")
            if isinstance(key, (str, int, float, bool)):
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml_mapping(path: str | Path, what: str = "a YAML config") -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; errors say which file and why (``what`` the file should be)."""
    file_path = Path(path)
    if file_path.is_dir():
        raise ConfigError(f"{file_path}: a folder, not a file; pass the path of {what}")
    if not file_path.is_file():
        raise ConfigError(f"{file_path}: no such file; pass the path of {what}")
    try:
        data = yaml.load(file_path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)
    except UnicodeDecodeError:
        raise ConfigError(f"{file_path}: not a text file (not UTF-8); pass a YAML config") from None
    except DuplicateKey as err:
        raise ConfigError(f"{file_path}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{file_path}: not valid YAML{yaml_error_text(err)}") from None
    if data is None:
        raise ConfigError(f"{file_path}: the file is empty; it must hold a YAML mapping")
    if not isinstance(data, dict):
        raise ConfigError(f"{file_path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def yaml_error_text(err: Exception) -> str:
    """A YAML or JSON parse error as one line: where (line and column, counted from 1) and what (PyYAML's own text
    runs to several lines and names "<unicode string>" instead of the file)."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if getattr(err, "lineno", None) is not None:  # json.JSONDecodeError
        where = f" at line {err.lineno}, column {err.colno}"
    problem = getattr(err, "problem", None) or getattr(err, "msg", None) or str(err).splitlines()[0]
    return f"{where}: {problem}"


def parse_set_value(key_path: str, raw_value: str) -> Any:
    """The YAML value of a ``--set KEY=VALUE`` override; a value that is not YAML names the key and the fix."""
    try:
        return yaml.safe_load(raw_value)
    except yaml.YAMLError as err:
        problem = str(getattr(err, "problem", None) or "not valid YAML")
        raise ConfigError(f"--set {key_path}: the value {raw_value!r} is not valid YAML ({problem}); quote it as "
                          f"a string (--set '{key_path}=\"...\"') or write a YAML list/mapping in full, "
                          f"e.g. [1, 2] or {{key: value}}") from None


def validate(model: type[BaseModel], data: Any, source: str, prefix: str = "") -> Any:
    """``model.model_validate(data)`` with errors turned into a ConfigError."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source, prefix, model)) from None
