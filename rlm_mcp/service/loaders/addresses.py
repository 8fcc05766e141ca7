"""Which addresses a URL load may reach.

Public addresses always. Over stdio, anything (the caller already runs on this machine).
Over HTTP, `RLM_MCP_ALLOW_PRIVATE_URLS=true` adds private networks (10/8, 172.16/12, 192.168/16,
fc00::/7, 100.64/10 ...) but never loopback, link-local (169.254.169.254 and fe80::: cloud
metadata), unspecified, multicast or reserved addresses: those, like any other address, only
when listed in `RLM_MCP_ALLOWED_URL_ADDRESSES` (addresses or networks).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["AddressPolicy", "parse_networks"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: Iterable[str]) -> list[Network]:
    """'127.0.0.1', '10.0.0.0/8', '::1' -> networks; raises ValueError naming a bad one."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address or network such as 127.0.0.1 or 10.0.0.0/8") from None
    return networks


def _never_by_default(addr: Address) -> bool:
    return addr.is_loopback or addr.is_link_local or addr.is_unspecified or addr.is_multicast or addr.is_reserved


def is_public(addr: Address) -> bool:
    return addr.is_global and not _never_by_default(addr)


@dataclass(frozen=True)
class AddressPolicy:
    """`allow_all`: stdio. `private`: RLM_MCP_ALLOW_PRIVATE_URLS. `listed`: always allowed."""

    allow_all: bool = False
    private: bool = False
    listed: tuple[Network, ...] = field(default_factory=tuple)

    def allows(self, addr: Address) -> bool:
        if self.allow_all or is_public(addr):
            return True
        if any(addr.version == n.version and addr in n for n in self.listed):
            return True
        return self.private and addr.is_private and not _never_by_default(addr)
