"""The store and loads sections: where contexts and runs are kept and how big they may grow, and
what a context load may read (folders, URLs)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any

import platformdirs
from pydantic import BaseModel, Field, field_validator
from pydantic_settings import NoDecode

from rlm_mcp.config.values import SECTION_CONFIG, CommaList


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("rlm-mcp", appauthor=False))


def _default_roots() -> list[Path]:
    return [Path.home()]


class StoreSettings(BaseModel):
    """RLM_MCP_ settings of the context and run stores (`settings.store`)."""

    model_config = SECTION_CONFIG

    data_dir: Path = Field(default_factory=_default_data_dir, description="Contexts, runs, index.")
    max_context_bytes: int = Field(
        0,
        ge=0,
        description="Largest single context in bytes; 0 (the default): the largest text context one sandbox of "
        "RLM_MCP_SANDBOX_MEMORY holds (about 410 MiB at 1g), so the two limits agree; raise the memory to raise both.",
    )
    store_max_bytes: int = Field(20 << 30, description="Context store size before LRU eviction.")
    store_max_bytes_per_owner: int | None = Field(
        None,
        ge=1,
        description="Each owner's (token's) share of the store: its contexts' bytes, and apart from them its "
        "unfinished uploads' bytes; default: with several tokens RLM_MCP_STORE_MAX_BYTES / tokens (so the shares fit "
        "the store's cap and one owner's loads never evict another's contexts), else none. The start log and doctor "
        "say the share in force.",
    )
    store_max_age_days: float = Field(30.0, description="Contexts unused this long are evicted.")
    context_grace_s: float = Field(
        900.0, ge=0, description="A context stored or used this recently is never evicted (covers load -> complete)."
    )

    @field_validator("data_dir", mode="after")
    @classmethod
    def _expand_data_dir(cls, value: Path) -> Path:
        return value.expanduser()


class LoadSettings(BaseModel):
    """RLM_MCP_ settings of what a context load may read: folders and URLs (`settings.loads`)."""

    model_config = SECTION_CONFIG

    allowed_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=_default_roots,
        description="Folders (os.pathsep-separated) MCP clients may load paths from; local commands read the paths typed to them.",
    )
    max_files: int = Field(20_000, description="Files one folder/glob load may take.")
    url_timeout_s: float = Field(30.0, description="Timeout of a URL fetch.")
    url_max_redirects: int = Field(5, description="Redirects a URL fetch may follow.")
    allow_private_urls: bool = Field(
        False, description="Over HTTP, allow URLs on private networks (never loopback or link-local unless listed)."
    )
    allowed_url_addresses: CommaList = Field(
        default_factory=list, description="Comma-separated addresses or networks URL loads may always reach."
    )

    @field_validator("allowed_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [Path(p).expanduser() for p in value.split(os.pathsep) if p.strip()]
        return value

    @field_validator("allowed_url_addresses", mode="after")
    @classmethod
    def _check_networks(cls, value: list[str]) -> list[str]:
        for item in value:  # a bad one stops the start
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an IP address or network such as 127.0.0.1 or 10.0.0.0/8") from None
        return value
