"""The settings a client should let its user set when installing rlm-mcp, described from the
settings model (name, description, default, form, secret or not)."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, metadata
from pathlib import Path

from pydantic_core import PydanticUndefined

from rlm_mcp.config import SETTING_FIELDS
from rlm_mcp.config_check import env_name
from rlm_mcp.config_forms import CLIENT_FORM_FIELDS

# The settings an installer asks for, in the order it asks: the endpoint, its model, its key, and
# the folders a client may read from. Every other setting keeps its default (docs: Configuration).
# Left empty (or as an unexpanded placeholder) they count as unset where the server reads them.
CLIENT_SETTINGS = CLIENT_FORM_FIELDS
REQUIRED = frozenset({"base_url", "model"})
SECRET = frozenset({"api_key", "auth_tokens"})
PACKAGE = "rlm-mcp"


@dataclass(frozen=True)
class SettingInput:
    field: str
    env: str
    description: str
    default: str | None
    form: str  # string | number | boolean | filepath
    required: bool
    secret: bool


def _form(annotation: object) -> str:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if annotation in (int, float):
        return "number"
    if annotation is bool:
        return "boolean"
    if annotation is Path:
        return "filepath"
    return "string"


def setting_inputs() -> list[SettingInput]:
    fields = SETTING_FIELDS
    found = []
    for name in CLIENT_SETTINGS:
        field = fields[name]
        default = field.default
        shown = None if default is PydanticUndefined or default is None or name in SECRET else str(default)
        found.append(
            SettingInput(
                field=name,
                env=env_name(name),
                description=field.description or name,
                default=shown,
                form=_form(field.annotation),
                required=name in REQUIRED,
                secret=name in SECRET,
            )
        )
    return found


def repository_url() -> str:
    """`[project.urls] Repository` as installed (pyproject.toml is where it is written)."""
    try:
        urls: list[str] = metadata(PACKAGE).get_all("Project-URL") or []
    except PackageNotFoundError as exc:  # pragma: no cover - the package runs installed
        raise RuntimeError("rlm-mcp is not installed; run from an installed package or `uv sync`.") from exc
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "repository":
            return str(url).strip()
    raise RuntimeError("pyproject.toml has no [project.urls] Repository.")


def registry_name() -> str:
    """`io.github.<owner>/<repo>`: the namespace the registry verifies through GitHub."""
    parts = repository_url().removeprefix("https://github.com/").strip("/").split("/")
    if len(parts) != 2 or not repository_url().startswith("https://github.com/"):
        raise RuntimeError(f"Repository URL {repository_url()} is not https://github.com/<owner>/<repo>.")
    return f"io.github.{parts[0]}/{parts[1]}"
