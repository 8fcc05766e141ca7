"""The one HTML page of the viewer: a shell, the model as JSON, the script that draws it.

Escaping is done by construction rather than by template: no run data is ever written into
markup. The model travels in one `<script type="application/json">` whose text can never close
the element (every `<`, `>` and `&` is a JSON `\\u` escape), and the script builds the DOM with
text nodes only. A per-page nonce in a Content-Security-Policy lets only that script run, so even
a mistake could not execute a model's `<img onerror>`. The page needs no network: style and
script are inlined, charts are plain SVG.
"""

from __future__ import annotations

import html
import json
import secrets
from functools import cache
from importlib import resources
from typing import Any, Literal


@cache
def _asset(name: str) -> str:
    return resources.files("rlm_mcp.viewer").joinpath("static", name).read_text(encoding="utf-8")


@cache
def _script() -> str:
    """The page's one script: the run page's part first (definitions only), then viewer.js, whose
    last lines draw the page once everything is defined; strict mode for both."""
    return '"use strict";\n' + _asset("viewer_run.js") + "\n" + _asset("viewer.js")


def json_for_script(value: Any) -> str:
    """JSON that is inert inside an HTML <script> element (no `</script>`, no `<!--`)."""
    text = json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
    for raw, escaped in (
        ("&", "\\u0026"),
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return text


def content_security_policy(nonce: str) -> str:
    return (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def render_page(
    view: Literal["index", "run", "session"],
    data: Any,
    *,
    title: str,
    live: dict[str, Any] | None = None,
    version: Any = None,
    run_href: str = "",
    index_href: str = "./",
) -> str:
    """A self-contained page. `live` ({"url", "interval_ms"}) makes it poll for new data."""
    nonce = secrets.token_urlsafe(18)
    config = {
        "view": view,
        "data": data,
        "live": live,
        "version": version,
        "run_href": run_href,
        "index_href": index_href,
    }
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{content_security_policy(nonce)}\">"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{html.escape(title)}</title><style nonce='{nonce}'>{_asset('viewer.css')}</style></head>"
        "<body><div id='app'></div>"
        f"<script type='application/json' id='rlm-data'>{json_for_script(config)}</script>"
        f"<script nonce='{nonce}'>{_script()}</script></body></html>"
    )
