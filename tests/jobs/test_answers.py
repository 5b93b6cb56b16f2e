"""daemon/net/answers.py: an httpcore answer's headers and body read as httpx's Response reads
them, checked against httpx itself."""

from __future__ import annotations

import gzip
import zlib

import httpx
import pytest

from daemon.net.answers import content_decoder, header_text

HEADS = [
    [(b"Content-Type", b"text/html"), (b"X-A", b"1"), (b"x-a", b"2"), (b"Location", b"/b")],
    [(b"Set-Cookie", b"a=1"), (b"Set-Cookie", b"b=2"), (b"Server", b"caf\xc3\xa9")],  # UTF-8
    [(b"Server", b"caf\xe9"), (b"X-B", b"\xc3\xa9")],  # not UTF-8 as a whole: ISO-8859-1
    [],
]


@pytest.mark.parametrize("raw", HEADS)
def test_header_text_is_what_httpx_shows(raw: list[tuple[bytes, bytes]]) -> None:
    assert header_text(raw) == dict(httpx.Headers(raw).items())


def test_header_text_joins_repeated_names() -> None:
    assert header_text(HEADS[0]) == {"content-type": "text/html", "x-a": "1, 2", "location": "/b"}
    assert header_text(HEADS[2]) == {"server": "café", "x-b": "Ã©"}


@pytest.mark.parametrize(
    ("coding", "encoded"),
    [
        (None, b"plain"),
        ("gzip", gzip.compress(b"plain")),
        ("GZIP ", gzip.compress(b"plain")),
        ("deflate", zlib.compress(b"plain")),
        ("deflate, gzip", gzip.compress(zlib.compress(b"plain"))),
        ("identity", b"plain"),
        ("x-unknown", b"plain"),
        ("x-unknown, gzip", gzip.compress(b"plain")),
    ],
)
def test_content_decoder_is_httpxs(coding: str | None, encoded: bytes) -> None:
    headers = {} if coding is None else {"content-encoding": coding}
    decoder = content_decoder(headers)
    assert decoder.decode(encoded[:3]) + decoder.decode(encoded[3:]) + decoder.flush() == b"plain"
    response = httpx.Response(200, headers=headers, content=encoded)
    assert response.content == b"plain"


def test_a_corrupt_body_raises_httpxs_decoding_error() -> None:
    with pytest.raises(httpx.DecodingError):
        content_decoder({"content-encoding": "gzip"}).decode(b"not gzip at all")
