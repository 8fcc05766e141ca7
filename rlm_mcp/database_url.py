"""`RLM_MCP_DATABASE_URL`: checked without the driver, and its password kept out of every message.

The URL is parsed here, by rules that need no driver, before libpq ever sees it: libpq's own
parse errors quote the text they stumbled on, which for a password holding a space or a stray
`%` is the password itself. So the settings validator refuses such a URL with a message that
names what to percent-encode and never echoes the value, and `redact` removes the password
(as written, and as decoded) from any text before it is shown.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = ["check_database_url", "redact", "url_password"]

_SCHEMES = ("postgresql://", "postgres://")
_ENCODE = "percent-encode it: a space as %20, % as %25, @ as %40, : as %3A, / as %2F"


def _parts(url: str) -> tuple[str, str] | None:
    """(authority, what follows its first '/') of a URL, split as libpq splits it: the
    authority runs to the first '/', '?' and '#' included (libpq reads them in a password)."""
    for scheme in _SCHEMES:
        if url.startswith(scheme):
            authority, _, path = url[len(scheme) :].partition("/")
            return authority, path
    return None


def _userinfo(url: str) -> str | None:
    """The `user:password` part of a URL (to the authority's last '@'), found without a driver."""
    parts = _parts(url)
    if parts is None or "@" not in parts[0]:
        return None
    return parts[0][: parts[0].rfind("@")]


def url_password(url: str) -> str | None:
    """The password as written in the URL (None when it has none)."""
    info = _userinfo(url)
    if info is None or ":" not in info:
        return None
    return info.split(":", 1)[1] or None


def check_database_url(url: str) -> None:
    """Raise ValueError (never quoting the URL) when libpq could not read it as meant."""
    if not url.startswith(_SCHEMES):
        raise ValueError("must be a postgresql://user:password@host:port/dbname URL")
    if any(c.isspace() for c in url):
        raise ValueError(f"holds a space or another blank (in the password, perhaps): {_ENCODE}")
    if re.search(r"%(?![0-9A-Fa-f]{2})", url):
        raise ValueError(f"holds a % that starts no %XX escape (in the password, perhaps): {_ENCODE}")
    authority, path = _parts(url) or ("", "")
    if authority.count("@") > 1:
        raise ValueError(f"holds more than one @ before the host (in the password, perhaps): {_ENCODE}")
    if "@" in path.partition("?")[0]:
        raise ValueError(f"holds an @ after a / (a / in the password, perhaps): {_ENCODE}")
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # the team extra is missing: said when team mode starts
        return
    try:
        conninfo_to_dict(url)
    except Exception:
        raise ValueError(f"cannot be read as a PostgreSQL URL; {_ENCODE}") from None


def redact(text: str, url: str) -> str:
    """`text` without the URL's password, as written and as decoded, nor any URL's userinfo."""
    password = url_password(url)
    for secret in {password, unquote(password)} if password else set():
        if secret:
            text = text.replace(secret, "***")
    return re.sub(r"(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@", r"\1***@", text)
