"""`server.json` for the MCP Registry, and the checks the registry applies to it.

The checks are the parts of the registry's schema this file uses, written as a pydantic model:
https://static.modelcontextprotocol.io/schemas/2025-09-29/server.schema.json (read from
modelcontextprotocol/registry, docs/reference/server-json/server.schema.json). Not vendored: only
the rules below apply to what we publish (name pattern and length, description length, a fixed
version, each package's registry type, identifier, version and transport, environment variables).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlm_mcp import __version__
from rlm_mcp.publish.inputs import PACKAGE, registry_name, repository_url, setting_inputs

SCHEMA_URL = "https://static.modelcontextprotocol.io/schemas/2025-09-29/server.schema.json"
DESCRIPTION = "Recursive Language Models over MCP: an LM writes Python against huge contexts in a Docker sandbox."
_RANGE = re.compile(r"[\^~<>=*]|\.x\b|^latest$")


def _fixed_version(value: str) -> str:
    if _RANGE.search(value):
        raise ValueError(f"{value!r} is a range or 'latest'; the registry needs one fixed version")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class KeyValueInput(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    default: str | None = None
    format: Literal["string", "number", "boolean", "filepath"] = "string"
    is_required: bool = Field(False, alias="isRequired")
    is_secret: bool = Field(False, alias="isSecret")


class Transport(_Strict):
    type: Literal["stdio", "streamable-http", "sse"]


class Package(_Strict):
    registry_type: Literal["npm", "pypi", "nuget"] = Field(alias="registryType")
    identifier: str = Field(min_length=1)
    version: str = Field(min_length=1)
    runtime_hint: str | None = Field(None, alias="runtimeHint")
    transport: Transport
    environment_variables: list[KeyValueInput] = Field(default_factory=list, alias="environmentVariables")

    _version = field_validator("version")(_fixed_version)


class Repository(_Strict):
    url: str = Field(pattern=r"^https://")
    source: str = Field(min_length=1)


class ServerJson(_Strict):
    schema_: str = Field(alias="$schema", pattern=r"/schemas/\d{4}-\d{2}-\d{2}/server\.schema\.json$")
    name: str = Field(min_length=3, max_length=200, pattern=r"^[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+$")
    description: str = Field(min_length=1, max_length=100)
    version: str = Field(max_length=255)
    repository: Repository | None = None
    packages: list[Package] = Field(default_factory=list)

    _version = field_validator("version")(_fixed_version)

    @field_validator("schema_")
    @classmethod
    def _not_older(cls, value: str) -> str:
        date = re.search(r"/schemas/(\d{4}-\d{2}-\d{2})/", value)
        if date is None or date[1] < "2025-09-29":
            raise ValueError("server.json must use the 2025-09-29 schema or a newer one")
        return value


def server_json() -> dict[str, Any]:
    """The registry entry for this version, generated from the settings model and the package."""
    env: list[dict[str, Any]] = [
        {
            "name": s.env,
            "description": s.description,
            "default": s.default,
            "format": s.form,
            "isRequired": s.required,
            "isSecret": s.secret,
        }
        for s in setting_inputs()
    ]
    env.append(
        {
            "name": "DOCKER_HOST",
            "description": "Docker daemon socket (Docker is required); default: the platform's usual socket.",
        }
    )
    package = {
        "registryType": "pypi",
        "identifier": PACKAGE,
        "version": __version__,
        "runtimeHint": "uvx",
        "transport": {"type": "stdio"},
        "environmentVariables": env,
    }
    entry = ServerJson.model_validate(
        {
            "$schema": SCHEMA_URL,
            "name": registry_name(),
            "description": DESCRIPTION,
            "version": __version__,
            "repository": {"url": repository_url(), "source": "github"},
            "packages": [package],
        }
    )
    return entry.model_dump(by_alias=True, exclude_none=True, exclude_defaults=False)
