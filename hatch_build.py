"""Build hook: README.md as PyPI's long description. PyPI shows no file of the repository, so
images are dropped (the viewer screenshots stay in the repository's README) and relative links
become absolute links into the repository named by `[project.urls] Repository`, the one place
that URL is written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hatchling.metadata.plugin.interface import MetadataHookInterface

IMAGE_LINE = re.compile(r"^!\[[^\]]*\]\([^)]*\)\s*$", re.MULTILINE)
RELATIVE_LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s]+)\)")


def long_description(readme: str, repository: str) -> str:
    text = IMAGE_LINE.sub("", readme)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return RELATIVE_LINK.sub(lambda m: f"]({repository.rstrip('/')}/blob/main/{m[1]})", text)


class CustomMetadataHook(MetadataHookInterface):
    def update(self, metadata: dict[str, Any]) -> None:
        readme = (Path(self.root) / "README.md").read_text(encoding="utf-8")
        repository = metadata.get("urls", {}).get("Repository", "")
        metadata["readme"] = {"content-type": "text/markdown", "text": long_description(readme, repository)}
