"""The edge's pure rules, as tables: keys, Host names, cross-site signals, media types."""

from __future__ import annotations

import pytest

from daemon.api.edge import (
    HostRule,
    bearer_matches,
    cross_site_reason,
    media_type_refusal,
    parse_keys,
    split_host,
)
from daemon.config import HttpConfig

KEYS = parse_keys(" alpha-key-0123456789 ,beta-key-0123456789,, ")


def test_parse_keys() -> None:
    assert KEYS == (b"alpha-key-0123456789", b"beta-key-0123456789")
    assert parse_keys(None) == () and parse_keys(" , ") == ()


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer alpha-key-0123456789", True),
        ("bearer beta-key-0123456789", True),
        ("BEARER   alpha-key-0123456789  ", True),
        ("Bearer alpha-key-012345678", False),  # a prefix of a key
        ("Bearer alpha-key-01234567890", False),
        ("Basic alpha-key-0123456789", False),
        ("alpha-key-0123456789", False),
        ("Bearer ", False),
        ("Bearer alpha-key-0123456789,beta-key-0123456789", False),
        ("Bearer \udcff", False),
        (None, False),
    ],
)
def test_bearer_matches(header: str | None, ok: bool) -> None:
    assert bearer_matches(header, KEYS) is ok


def test_no_keys_match_nothing() -> None:
    assert not bearer_matches("Bearer x", ())


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("LocalHost:8700", ("localhost", 8700)),
        ("localhost", ("localhost", None)),
        ("example.com.", ("example.com", None)),
        ("[::1]:8700", ("[::1]", 8700)),
        ("[::1]", ("[::1]", None)),
        ("::1", ("[::1]", None)),
        ("host:abc", ("", None)),
        ("[::1", ("", None)),
        ("host:１２", ("", None)),
    ],
)
def test_split_host(value: str, expected: tuple[str, int | None]) -> None:
    assert split_host(value) == expected


DEFAULT = HostRule.from_config(HttpConfig(bind="127.0.0.1:8700"))


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8700", True),
        ("localhost:8700", True),
        ("localhost", True),
        ("[::1]:8700", True),
        ("localhost:8701", False),
        ("evil.example:8700", False),
        ("localhost.evil.example:8700", False),
        ("[::1", False),
        ("[::1:8700", False),
        ("", False),
        (None, False),
    ],
)
def test_default_hosts(host: str | None, ok: bool) -> None:
    assert DEFAULT.allows(host, 8700) is ok


def test_configured_hosts() -> None:
    rule = HostRule.from_config(HttpConfig(hosts=["api.example", "edge.example:8443", "h80:80"]))
    assert rule.allows("api.example", 8700) and rule.allows("api.example:8700", 8700)
    assert not rule.allows("api.example:9", 8700)
    assert rule.allows("edge.example:8443", 8700) and not rule.allows("edge.example", 8700)
    assert rule.allows("h80", 8700)
    assert not rule.allows("localhost:8700", 8700)
    anything = HostRule.from_config(HttpConfig(hosts=["*"]))
    assert anything.allows("whatever.example", 1)


@pytest.mark.parametrize(
    ("fetch_site", "origin", "host", "refused"),
    [
        (None, None, "localhost:8700", False),  # curl, an SDK
        ("none", None, "localhost:8700", False),  # typed in the address bar
        ("same-origin", "http://localhost:8700", "localhost:8700", False),
        ("cross-site", None, "localhost:8700", True),  # <img src>, a form on any site
        ("same-site", None, "localhost:8700", True),  # another port of localhost
        ("Cross-Site", None, "localhost:8700", True),
        (None, "https://evil.example", "localhost:8700", True),
        (None, "http://localhost:3000", "localhost:8700", True),
        (None, "null", "localhost:8700", True),
        (None, "http://localhost", "localhost:80", False),
        (None, "https://api.example", "api.example", False),
        (None, "https://api.example:443", "api.example", False),
        (None, "ftp://localhost:8700", "localhost:8700", True),
    ],
)
def test_cross_site(fetch_site: str | None, origin: str | None, host: str, refused: bool) -> None:
    assert (cross_site_reason(fetch_site, origin, host) is not None) is refused


@pytest.mark.parametrize(
    ("method", "content_type", "length", "chunked", "refused"),
    [
        ("GET", "text/plain", "5", False, False),
        ("POST", "application/json", "5", False, False),
        ("POST", "Application/JSON; charset=utf-8", "5", False, False),
        ("POST", "application/merge-patch+json", "5", False, False),
        ("POST", "text/plain", "5", False, True),
        ("POST", "text/plain", None, False, True),
        ("POST", "application/x-www-form-urlencoded", "5", False, True),
        ("POST", "multipart/form-data; boundary=x", "5", False, True),
        ("POST", "application/jsonx", "5", False, True),
        ("POST", None, None, False, False),
        ("POST", None, "0", False, False),
        ("POST", None, "5", False, True),
        ("POST", None, None, True, True),
        ("DELETE", None, None, False, False),
        ("DELETE", "text/plain", "0", False, True),
        ("PUT", None, "1", False, True),
    ],
)
def test_media_type(
    method: str, content_type: str | None, length: str | None, chunked: bool, refused: bool
) -> None:
    assert (media_type_refusal(method, content_type, length, chunked) is not None) is refused


@pytest.mark.parametrize(
    ("bind", "key_env", "allowed"),
    [
        ("127.0.0.1:8700", None, True),
        ("[::1]:8700", None, True),
        ("0.0.0.0:8700", "K", True),
        ("127.0.0.1:8700", "K", True),
    ],
)
def test_get_consume_needs_loopback_or_a_key(bind: str, key_env: str | None, allowed: bool) -> None:
    from daemon.api.collector import get_consume_allowed

    assert get_consume_allowed(HttpConfig(bind=bind, api_key_env=key_env)) is allowed
    # a public bind without a key cannot even be configured
    with pytest.raises(ValueError, match="api_key_env"):
        HttpConfig(bind="0.0.0.0:8700")
