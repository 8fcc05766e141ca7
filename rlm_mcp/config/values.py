"""How setting values are written: sizes (`256m`), comma-separated lists, JSON objects, endpoint
servers. Shared by the sections' validators, so each form has one parser."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BeforeValidator, ConfigDict
from pydantic_settings import NoDecode

_DEFAULT_PORTS = {"http": 80, "https": 443}

# A section built on its own (a test's `LMSettings(base_url=...)`) checks its defaults and refuses
# a name it does not own; `Settings` overrides `extra` (the environment holds other variables).
SECTION_CONFIG = ConfigDict(extra="forbid", validate_default=True)


def parse_size(text: str) -> int:
    """'256m' -> bytes. Docker's units: b, k, m, g (powers of 1024), an optional trailing 'b'."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)b?\s*", text.lower())
    if match is None:
        raise ValueError(f"{text!r} is not a size such as 512m or 2g")
    return int(float(match[1]) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[match[2]])


def comma_list(value: Any) -> Any:
    """A comma-separated string as its items (blanks dropped); any other value as given."""
    if isinstance(value, str):
        return [m.strip() for m in value.split(",") if m.strip()]
    return value


# A list setting written as one comma-separated string (`a,b`), or given as a list.
CommaList = Annotated[list[str], NoDecode, BeforeValidator(comma_list)]


def json_object(value: Any, name: str, *, empty: Any) -> Any:
    """A JSON object written as a string (an environment variable) as a dict; `empty` for a blank
    string; any other value as given. `name` is the setting's variable, for the error."""
    if not isinstance(value, str):
        return value
    value = value.strip()
    if not value:
        return empty
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} must be a JSON object: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ValueError(f"{name} must be a JSON object")
    return parsed


def server_of(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of an endpoint URL, the port defaulted by scheme: what makes two
    endpoints one server."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port if port is not None else _DEFAULT_PORTS.get(scheme)
