# Placeholder replaced in the fetch step; the result types are shared with document.py.
from __future__ import annotations

import msgspec


class FetchResult(msgspec.Struct, frozen=True):
    requested_url: str
    url: str
    status_code: int
    content_type: str
    headers: dict[str, str]
    body: bytes
    redirects: list[str] = []
