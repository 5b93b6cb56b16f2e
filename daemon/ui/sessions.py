# The console's sessions: a browser that typed the API key once holds a random session token in
# an HttpOnly, SameSite=Strict cookie, and every request that changes data also carries that
# session's CSRF token in a header (a page of another site can neither read the token nor set
# the header). Pure rules over header values with the clock passed in, so the tests need no
# server; the HTTP edge (daemon/api/edge.py) calls `refusal` as its second way in after the key.
from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from daemon.api.edge import SAFE_METHODS
from daemon.clock import wall_ms

COOKIE = "crawld_session"
CSRF_HEADER = "x-csrf-token"
TTL_MS = 12 * 3600 * 1000
"""A session lasts 12 hours from the login, then the console asks for the key again."""
MAX_SESSIONS = 1000
"""The oldest session goes when a login would make more (sessions live in memory only)."""
KEYLESS_PATHS = frozenset({"/ui", "/ui/", "/ui/api/session", "/ui/api/login"})
"""What a browser must reach before it has a session; still under the Host and cross-site rules."""
STATIC_PREFIX = "/ui/static/"


@dataclass(frozen=True)
class Session:
    csrf: str
    expires_ms: int


def cookie_value(header: str | None, name: str = COOKIE) -> str | None:
    """The value of cookie `name` in a `Cookie` header (the first one), or None."""
    if not header:
        return None
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value.strip().strip('"') or None
    return None


def set_cookie(token: str, *, secure: bool, max_age_s: int = TTL_MS // 1000) -> str:
    """The Set-Cookie value of a session: not readable by scripts, never sent cross-site."""
    flags = f"{COOKIE}={token}; Path=/; Max-Age={max_age_s}; HttpOnly; SameSite=Strict"
    return flags + ("; Secure" if secure else "")


def clear_cookie(*, secure: bool) -> str:
    return set_cookie("", secure=secure, max_age_s=0)


class Sessions:
    """The live sessions of this process, by token; implements the edge's SessionCheck."""

    def __init__(
        self,
        clock: Callable[[], int] = wall_ms,
        ttl_ms: int = TTL_MS,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self.clock = clock
        self.ttl_ms = ttl_ms
        self.max_sessions = max_sessions
        self._by_token: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._by_token)

    def create(self) -> tuple[str, Session]:
        now = self.clock()
        for token in [t for t, s in self._by_token.items() if s.expires_ms <= now]:
            del self._by_token[token]
        while len(self._by_token) >= self.max_sessions:
            del self._by_token[next(iter(self._by_token))]  # dicts keep insertion order
        token = secrets.token_urlsafe(32)
        session = Session(csrf=secrets.token_urlsafe(32), expires_ms=now + self.ttl_ms)
        self._by_token[token] = session
        return token, session

    def get(self, token: str | None) -> Session | None:
        if not token:
            return None
        session = self._by_token.get(token)
        if session is None:
            return None
        if session.expires_ms <= self.clock():
            del self._by_token[token]
            return None
        return session

    def drop(self, token: str | None) -> None:
        if token:
            self._by_token.pop(token, None)

    def from_headers(self, headers: Mapping[str, str]) -> Session | None:
        return self.get(cookie_value(headers.get("cookie")))

    # ---- SessionCheck (daemon/api/edge.py) ----

    def keyless(self, path: str) -> bool:
        return path in KEYLESS_PATHS or path.startswith(STATIC_PREFIX)

    def refusal(self, headers: Mapping[str, str], method: str) -> tuple[int, str] | None:
        session = self.from_headers(headers)
        if session is None:
            return 401, "the console session is missing or expired: log in again"
        if method.upper() not in SAFE_METHODS:
            given = headers.get(CSRF_HEADER, "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, session.csrf.encode()):
                return 403, "send this session's token in the X-CSRF-Token header"
        return None
