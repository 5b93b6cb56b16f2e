# An httpcore answer read as httpx's Response would read it, without building one: the crawl's
# direct hops (daemon/crawl/fetching/fetch.py) take their answers from httpcore, below httpx,
# because httpx's Request, Response, Headers and stream objects around each exchange were a
# large part of a crawled page's CPU on the event loop. What a page's FetchResult holds must not
# change with that, so the two things httpx did to an answer are done here the same way:
#
# - headers as text: names lower-case, a repeated name's values joined by ", ", every name and
#   value decoded as ASCII, else UTF-8, else ISO-8859-1 (one choice for the whole head), as
#   `httpx.Headers.items()` gives them;
# - the body decoded by its Content-Encoding with httpx's own decoders (gzip, deflate, and br and
#   zstd where their packages are installed; unknown codings skipped, several applied in turn),
#   so errors are httpx.DecodingError as before.
from __future__ import annotations

from collections.abc import Mapping, Sequence

from httpx._decoders import (  # no public name; the version is pinned
    SUPPORTED_DECODERS,
    ContentDecoder,
    IdentityDecoder,
    MultiDecoder,
)

__all__ = ["ContentDecoder", "content_decoder", "header_text"]


def _encoding(raw: Sequence[tuple[bytes, bytes]]) -> str:
    for encoding in ("ascii", "utf-8"):
        try:
            for key, value in raw:
                key.decode(encoding)
                value.decode(encoding)
        except UnicodeDecodeError:
            continue
        return encoding
    return "iso-8859-1"


def header_text(raw: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    """`raw` (httpcore's header list) as `dict(httpx.Headers(raw).items())`."""
    try:
        pairs = [(k.lower().decode("ascii"), v.decode("ascii")) for k, v in raw]
    except UnicodeDecodeError:
        encoding = _encoding(raw)
        pairs = [(k.lower().decode(encoding), v.decode(encoding)) for k, v in raw]
    text: dict[str, str] = {}
    for key, value in pairs:
        if key in text:
            text[key] += f", {value}"
        else:
            text[key] = value
    return text


def content_decoder(headers: Mapping[str, str]) -> ContentDecoder:
    """The decoder httpx's Response would use for `headers` (as `header_text` gives them)."""
    coding = headers.get("content-encoding")
    if coding is None:
        return IdentityDecoder()
    decoders = [
        SUPPORTED_DECODERS[name]()
        for value in coding.split(",")
        if (name := value.strip().lower()) in SUPPORTED_DECODERS
    ]
    if len(decoders) == 1:
        return decoders[0]
    if decoders:
        return MultiDecoder(children=decoders)
    return IdentityDecoder()
