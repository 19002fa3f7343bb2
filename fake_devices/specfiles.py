"""Reading validated YAML files, with errors that name the field (``pools[1].count``).

Shared by hardware profiles here and by the testbed's fleet and scenario files.
"""

from __future__ import annotations

from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class SpecFileError(ValueError):
    """A file that cannot be used; the message names the file and each bad field."""


def field_path(location: tuple[int | str, ...]) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in location).replace(".[", "[")


def describe(exc: ValidationError, what: str, source: str) -> str:
    lines = [f"invalid {what} {source}:"]
    lines += [f"  {field_path(e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()]
    return "\n".join(lines)


def parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecFileError(f"{source} is not valid YAML: {exc}") from exc


def validate(model: type[M], data: Any, what: str, source: str, error: type[SpecFileError] = SpecFileError) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(describe(exc, what, source)) from None
