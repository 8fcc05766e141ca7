"""Fetching a URL into a text context, without becoming an SSRF proxy.

* http/https only; redirects are followed by hand (at most `url_max_redirects`) so that every
  hop's host is checked, not only the first.
* Each host is resolved here and refused when any of its addresses is not allowed (`addresses`:
  public only by default; see there). The request then goes
  to the address that was checked (Host header and TLS SNI keep the name), so a DNS answer
  that changes between check and connect (DNS rebinding) cannot redirect it.
* Environment proxies are ignored (trust_env=False): a proxy would make the address check
  meaningless.
* `url_timeout_s` bounds each network operation (connect, each read); the whole fetch is
  bounded by ten times that, so a server trickling bytes cannot hold a load forever.
* Bytes are streamed to a temp file and capped at `max_context_bytes`. Text is decoded by the
  charset the server declares (re-encoded to UTF-8, undecodable bytes replaced), else must be
  UTF-8. Binary content types are refused; an untyped or octet-stream body is accepted only
  when it looks like UTF-8 text.
"""

from __future__ import annotations

import codecs
import ipaddress
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anyio
import httpx

from rlm_mcp.config import LoadSettings, StoreSettings
from rlm_mcp.errors import AccessDeniedError, BadArgumentError, context_too_large
from rlm_mcp.service.loaders.addresses import AddressPolicy
from rlm_mcp.service.loaders.common import Loaded, temp_file

REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})
SNIFF_BYTES = 8192
_TEXT_APPLICATION = frozenset(
    {
        "application/json",
        "application/ld+json",
        "application/x-ndjson",
        "application/ndjson",
        "application/jsonl",
        "application/xml",
        "application/xhtml+xml",
        "application/rss+xml",
        "application/atom+xml",
        "application/javascript",
        "application/x-javascript",
        "application/ecmascript",
        "application/x-yaml",
        "application/yaml",
        "application/toml",
        "application/sql",
        "application/graphql",
        "application/csv",
        "application/x-sh",
        "application/x-tex",
        "application/rtf",
        "application/x-www-form-urlencoded",
    }
)
_SNIFFED = frozenset({"", "application/octet-stream", "binary/octet-stream"})
_ADDR = ipaddress.IPv4Address | ipaddress.IPv6Address


def _fetch_error(url: str, why: str) -> BadArgumentError:
    return BadArgumentError(
        f"Could not fetch '{url}': {why}.",
        "Check that the URL is right and reachable from the machine running the server, "
        "or download it yourself and upload the text with rlm_upload_context.",
    )


def _parse(url: str) -> httpx.URL:
    try:
        parsed = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise BadArgumentError(f"'{url}' is not a valid URL ({exc}).", "Pass a full http:// or https:// URL.") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise BadArgumentError(
            f"'{url}' is not an http(s) URL.", "Only http:// and https:// URLs can be loaded; pass files as paths."
        )
    return parsed


async def _checked_address(url: httpx.URL, allow_private: bool | AddressPolicy) -> str:
    host = url.host
    try:
        addrs: list[_ADDR] = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            infos = await anyio.getaddrinfo(
                host, url.port or (443 if url.scheme == "https" else 80), type=socket.SOCK_STREAM
            )
        except OSError as exc:
            raise _fetch_error(str(url), f"the host '{host}' cannot be resolved ({exc})") from None
        addrs = []
        for info in infos:
            addr = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            if addr not in addrs:
                addrs.append(addr)
        if not addrs:
            raise _fetch_error(str(url), f"the host '{host}' has no address") from None
    policy = allow_private if isinstance(allow_private, AddressPolicy) else AddressPolicy(allow_all=allow_private)
    refused = [a for a in addrs if not policy.allows(a)]
    if refused:
        raise AccessDeniedError(
            f"'{host}' resolves to a private or local address ({refused[0]}), and such URLs are refused here.",
            "Load public URLs only, or (if this server should reach that service) have the operator list its "
            "address in RLM_MCP_ALLOWED_URL_ADDRESSES (RLM_MCP_ALLOW_PRIVATE_URLS=true opens private networks, "
            "never loopback or link-local addresses).",
        )
    return str(addrs[0])


def _pinned(url: httpx.URL, address: str) -> tuple[httpx.URL, dict[str, str], dict[str, Any]]:
    """The request aimed at the checked address, with the name kept for Host and SNI."""
    host = url.host
    host_header = f"[{host}]" if ":" in host else host
    if url.port is not None:
        host_header += f":{url.port}"
    headers = {"Host": host_header, "User-Agent": "rlm-mcp", "Accept": "text/*, application/json, */*;q=0.5"}
    extensions = {"sni_hostname": host} if url.scheme == "https" else {}
    return url.copy_with(host=address), headers, extensions


def _media_type(response: httpx.Response, url: str) -> tuple[str, str | None]:
    mime = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    textual = (
        mime.startswith("text/") or mime in _TEXT_APPLICATION or mime.endswith(("+json", "+xml")) or mime in _SNIFFED
    )
    if not textual:
        raise BadArgumentError(
            f"'{url}' serves '{mime}', which is not text.",
            "Load a text resource (HTML, plain text, JSON, CSV, ...); convert documents such as PDFs "
            "to text first and upload the text with rlm_upload_context.",
        )
    return mime, response.charset_encoding


async def fetch_url(
    url: str, *, loads: LoadSettings, store: StoreSettings, allow_private: bool | AddressPolicy
) -> Loaded:
    """`allow_private`: True reaches any address (stdio), False public ones only, or a policy.
    `loads`: the fetch's timeout and redirects; `store`: where the temp file goes, the largest context."""
    current = _parse(url)
    max_redirects = loads.url_max_redirects
    fd, tmp = await anyio.to_thread.run_sync(lambda: temp_file(store))
    os.close(fd)  # reopened below in the worker threads that write it
    try:
        with anyio.fail_after(loads.url_timeout_s * 10):
            async with httpx.AsyncClient(
                timeout=httpx.Timeout(loads.url_timeout_s), follow_redirects=False, trust_env=False
            ) as client:
                redirects = 0
                while True:
                    address = await _checked_address(current, allow_private)
                    target, headers, extensions = _pinned(current, address)
                    request = client.build_request("GET", target, headers=headers, extensions=extensions)
                    response = await client.send(request, stream=True)
                    try:
                        if response.status_code in REDIRECT_CODES and "location" in response.headers:
                            redirects += 1
                            if redirects > max_redirects:
                                raise BadArgumentError(
                                    f"'{url}' redirects more than {max_redirects} times.",
                                    "Pass the final URL directly, or raise RLM_MCP_URL_MAX_REDIRECTS.",
                                )
                            nxt = current.join(response.headers["location"])
                            current = _parse(str(nxt))
                            continue
                        if response.status_code >= 400:
                            raise _fetch_error(url, f"the server answered HTTP {response.status_code}")
                        mime, charset = _media_type(response, url)
                        raw = await _stream_text(response, tmp, store, url, mime, charset)
                    finally:
                        await response.aclose()
                    break
    except TimeoutError:
        tmp.unlink(missing_ok=True)
        raise _fetch_error(url, f"it took longer than {loads.url_timeout_s * 10:g} s") from None
    except httpx.TimeoutException:
        tmp.unlink(missing_ok=True)
        raise _fetch_error(url, f"no answer within {loads.url_timeout_s:g} s (RLM_MCP_URL_TIMEOUT_S)") from None
    except httpx.HTTPError as exc:
        tmp.unlink(missing_ok=True)
        raise _fetch_error(url, f"{type(exc).__name__}: {exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    final = str(current)
    first = _parse(url)
    name = unquote(first.path.rstrip("/").rsplit("/", 1)[-1]) or first.host
    source = {
        "type": "url",
        "url": url,
        "final_url": final,
        "content_type": mime,
        "charset": charset,
        "redirects": redirects,
        "bytes": raw,
        "summary": f"{raw} bytes of {mime or 'untyped'} text from {final}"
        + (f" after {redirects} redirect{'s' if redirects != 1 else ''}" if redirects else "")
        + ".",
    }
    return Loaded(name=name, source=source, path=tmp)


async def _stream_text(
    response: httpx.Response, tmp: Path, store: StoreSettings, url: str, mime: str, charset: str | None
) -> int:
    """Write the body to `tmp` as UTF-8; return the bytes received."""
    limit = store.max_context_bytes
    too_large = context_too_large(limit, url, narrow="Load a smaller resource")
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    codec = "utf-8" if charset is None else _safe_codec(charset, url)
    utf8 = codecs.lookup(codec).name == "utf-8"
    decoder = codecs.getincrementaldecoder(codec)("strict" if utf8 else "replace")
    received = 0
    async with await anyio.open_file(tmp, "wb") as out:  # writes run in worker threads
        # aiter_bytes undoes Content-Encoding, so the cap counts what is stored (no gzip bombs).
        async for block in response.aiter_bytes():
            if received + len(block) > limit:
                raise too_large
            if utf8 and received < SNIFF_BYTES and b"\0" in block[: SNIFF_BYTES - received]:
                raise _not_text(url, mime)
            try:
                text = decoder.decode(block)
            except UnicodeDecodeError:
                raise _not_text(url, mime) from None
            received += len(block)
            await out.write(block if utf8 else text.encode("utf-8"))
        try:
            tail = decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise _not_text(url, mime) from None
        if tail and not utf8:
            await out.write(tail.encode("utf-8"))
    return received


def _safe_codec(charset: str, url: str) -> str:
    try:
        return codecs.lookup(charset).name
    except LookupError:
        raise BadArgumentError(
            f"'{url}' declares an unknown charset '{charset}'.", "Download it, convert it to UTF-8 and upload the text."
        ) from None


def _not_text(url: str, mime: str) -> BadArgumentError:
    return BadArgumentError(
        f"'{url}' ({mime or 'no content type'}) is binary data or not UTF-8 text.",
        "Load a text resource; convert documents such as PDFs to text first and upload the text with rlm_upload_context.",
    )
