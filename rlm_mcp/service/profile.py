"""Which prompt profile a server uses, decided once: the one owner of that rule.

`RLM_MCP_PROMPT_PROFILE`:
- `auto` (default): `canonical` when the root model is the trained adapter (see `is_adapter`),
  else `rlm-mcp`. For the adapter, a missing reference copy is fetched once (the pinned wheel,
  no dependencies, SHA-256 checked) into the data dir; when that fails (offline), the server runs
  with `rlm-mcp` and logs the one command that fixes it.
- `canonical`: required; an error naming the fix when the reference cannot be read.
- `rlm-mcp`, `file:PATH`: the project's own texts.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from rlm_mcp.config import ServiceSettings
from rlm_mcp.engine.formatting import format_outputs
from rlm_mcp.engine.profiles import FORMAT_SAMPLES, CanonicalProfile, PromptProfile, format_trained_cell
from rlm_mcp.engine.prompts import check_canonical, resolve_system_prompt
from rlm_mcp.errors import BadArgumentError, RlmMcpError
from rlm_mcp.reference import (
    ReferenceTexts,
    ReferenceUnavailable,
    fetch_wheel,
    find_reference_source,
    load_reference_texts,
)
from rlm_mcp.reference.wheel import FETCH_COMMAND

log = logging.getLogger("rlm_mcp.service")

ADAPTER_MODELS = ("rlm-v0.1",)


def is_adapter(model: str) -> bool:
    """The trained adapter: the README's name for it, or its Hugging Face name."""
    name = model.strip().lower()
    return name in ADAPTER_MODELS or "rlm-qwen3-30b-a3b" in name


@dataclass(frozen=True)
class ProfileChoice:
    profile: PromptProfile
    detail: str  # why this profile (doctor and the log show it)
    fix: str = ""  # when the adapter does not get `canonical`: the command that fixes it


@functools.cache
def _texts(source: Path) -> ReferenceTexts:
    texts = load_reference_texts(source, [s.to_reference() for s in FORMAT_SAMPLES])
    for sample, theirs in zip(FORMAT_SAMPLES, texts.formatted, strict=True):
        ours = format_outputs([format_trained_cell(b) for b in sample.blocks], sample.limit)
        if ours != theirs:
            raise ReferenceUnavailable(
                f"The reference at {source} lays REPL output out differently from rlm-mcp's canonical layout.",
                "Use rlms 0.1.3 (the version the adapter was trained with).",
            )
    check_canonical(texts.system)
    return texts


def canonical_profile(data_dir: Path, *, fetch: bool) -> CanonicalProfile:
    """The canonical profile from the reference copy (fetched first when `fetch` and missing)."""
    source = find_reference_source(data_dir)
    if source is None and fetch:
        source = fetch_wheel(data_dir)
    if source is None:
        raise ReferenceUnavailable(
            "The reference texts (rlms 0.1.3) are not on this machine.",
            f"Run `{FETCH_COMMAND}` once (downloads one 110 kB wheel, no dependencies).",
        )
    return CanonicalProfile(_texts(source))


def choose_profile(settings: ServiceSettings, *, fetch: bool | None = None) -> ProfileChoice:
    """Decide the profile in effect. Blocking (a subprocess, maybe a download): run it in a thread.
    `fetch` (default: the `reference_fetch` setting) allows fetching a missing reference copy."""
    fetch = settings.reference_fetch if fetch is None else fetch
    name = (settings.prompt_profile or "").strip()
    if name == "canonical":
        try:
            return ProfileChoice(
                canonical_profile(settings.data_dir, fetch=fetch), "required by RLM_MCP_PROMPT_PROFILE"
            )
        except RlmMcpError as exc:
            raise BadArgumentError(f"The 'canonical' profile cannot be used: {exc.cause}", exc.fix) from None
    if name != "auto":
        return ProfileChoice(PromptProfile(resolve_system_prompt(name), name if name == "rlm-mcp" else "file"), "set")
    if not is_adapter(settings.model):
        return ProfileChoice(
            PromptProfile(resolve_system_prompt("rlm-mcp")), f"auto: {settings.model} is not the adapter"
        )
    try:
        profile = canonical_profile(settings.data_dir, fetch=fetch)
    except RlmMcpError as exc:
        return ProfileChoice(
            PromptProfile(resolve_system_prompt("rlm-mcp")),
            f"auto: the adapter should get canonical, but {exc.cause}",
            f"Run `{FETCH_COMMAND}`.",
        )
    return ProfileChoice(profile, f"auto: {settings.model} is the trained adapter")
