"""The settings an installer's form asks for, and what a host passes for a field left empty.

Hosts (the Claude Desktop bundle's dialog, clients reading the MCP Registry's `server.json`) pass
an optional field their user left empty as "" and some pass an unexpanded `${user_config.x}`.
For these settings either one means "not set": the default applies, never a root, a key, a model
or a URL made of it. Elsewhere a blank value keeps its meaning (a blank RLM_MCP_AUTH_TOKEN still
stops the start).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

__all__ = ["CLIENT_FORM_FIELDS", "FormFieldsFilled", "unfilled"]

# The settings an installer asks for (publish/inputs.py: the bundle's dialog and server.json).
CLIENT_FORM_FIELDS = ("base_url", "model", "api_key", "sub_model", "max_model_len", "allowed_roots")
_UNFILLED = re.compile(r"\s*(\$\{[^}]*\}\s*)?")


def unfilled(value: object) -> bool:
    """A form value its host did not fill in: blank, or a `${...}` placeholder left as it was."""
    return isinstance(value, str) and _UNFILLED.fullmatch(value) is not None


class FormFieldsFilled(PydanticBaseSettingsSource):
    """The environment, less the installer-form settings its host left unfilled."""

    def __init__(self, settings_cls: type[BaseSettings], inner: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self._inner = inner

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._inner.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        values = self._inner()
        return {k: v for k, v in values.items() if not (k in CLIENT_FORM_FIELDS and unfilled(v))}
