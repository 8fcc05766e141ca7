"""Signed viewer codes and sessions (`rlm_mcp.viewer.signed`): what verifies and what does not."""

from __future__ import annotations

import base64
import string

import pytest

from rlm_mcp.viewer import signed

KEY = b"k" * 32
ALPHABET = string.ascii_letters + string.digits + "-_"  # base64url


def test_a_signed_session_verifies_as_its_kind_and_owner() -> None:
    token = signed.sign(KEY, "session", "owner-1", ttl_s=60)
    verified = signed.verify(KEY, "session", token)
    assert verified is not None and verified[0] == "owner-1"
    assert signed.verify(KEY, "code", token) is None  # another kind
    assert signed.verify(b"x" * 32, "session", token) is None  # another key


def test_an_expired_token_is_refused() -> None:
    assert signed.verify(KEY, "session", signed.sign(KEY, "session", "owner-1", ttl_s=-1)) is None


@pytest.mark.parametrize("position", [0, 21, 41, 42])
def test_a_mac_with_any_character_changed_is_refused(position: int) -> None:
    payload, mac = signed.sign(KEY, "session", "owner-1", ttl_s=60).split(".")
    for other in ALPHABET:
        if other == mac[position]:
            continue
        forged = mac[:position] + other + mac[position + 1 :]
        assert signed.verify(KEY, "session", f"{payload}.{forged}") is None, forged


def test_only_the_macs_own_encoding_verifies() -> None:
    """A 32-byte MAC is 43 base64 characters whose last one carries 4 bits: three other last
    characters decode to the same bytes, and the decoder drops characters outside the alphabet.
    None of those spellings opens the session."""
    payload, mac = signed.sign(KEY, "session", "owner-1", ttl_s=60).split(".")
    raw = base64.urlsafe_b64decode(mac + "=")
    same_bytes = [
        mac[:-1] + c for c in ALPHABET if c != mac[-1] and base64.urlsafe_b64decode(mac[:-1] + c + "=") == raw
    ]
    assert len(same_bytes) == 3  # the premise: the decoder accepts them as the same MAC
    for spelling in [*same_bytes, mac[:10] + "!" + mac[10:], mac + "="]:
        assert signed.verify(KEY, "session", f"{payload}.{spelling}") is None, spelling


def test_a_changed_payload_or_a_malformed_token_is_refused() -> None:
    payload, mac = signed.sign(KEY, "session", "owner-1", ttl_s=60).split(".")
    other = signed.sign(KEY, "session", "owner-2", ttl_s=60).split(".")[0]
    for token in (
        f"{other}.{mac}",
        f"{payload}.",
        f".{mac}",
        payload,
        f"{payload}.{mac}.x",
        "",
        None,
        f"{payload}.\udcff",
    ):
        assert signed.verify(KEY, "session", token) is None, token
