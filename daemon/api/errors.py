# One shape for every HTTP error the daemon and its simulators answer with, so clients parse one
# thing: {"error": "<what is wrong>", "detail": <field path, value or list of problems>}. Errors
# often quote what the client sent (a task id, a URL, msgspec's message about a value), so every
# string in an answer is cut short here, once, instead of at each raise.
from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from daemon.jsonvalues import integral_floats
from daemon.redact import cap_message, redact_text

T = TypeVar("T")


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)


class HTTPError(Exception):
    """Raise from a route to answer `status` with {"error": message, "detail": detail}."""

    def __init__(self, status: int, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.detail = detail


def capped(value: Any) -> Any:
    """`value` with every string (keys too) cut to about redact.ECHO_LIMIT characters and the
    URLs in it redacted."""
    if isinstance(value, str):
        return cap_message(redact_text(value))
    if isinstance(value, dict):
        return {capped(k): capped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [capped(v) for v in value]
    return value


def error_response(status: int, message: str, detail: Any = None) -> JSONResponse:
    return JSONResponse(
        {"error": cap_message(redact_text(message)), "detail": capped(detail)}, status_code=status
    )


async def read_json_body(request: Request, type_: type[T], *, empty_ok: bool = True) -> T:
    """Decode the request body into `type_` or raise HTTPError(400/422) naming the field."""
    body = await request.body()
    if not body:
        if empty_ok:
            body = b"{}"
        else:
            raise HTTPError(400, "request body is required")
    try:
        return msgspec.convert(integral_floats(msgspec.json.decode(body)), type_)
    except msgspec.ValidationError as exc:
        raise HTTPError(422, "invalid request body", str(exc)) from None
    except msgspec.DecodeError as exc:
        raise HTTPError(400, "request body is not valid JSON", str(exc)) from None
    except RecursionError:
        raise HTTPError(400, "request body is nested too deeply") from None


async def handle_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPError)
    return error_response(exc.status, exc.message, exc.detail)


_ASCII_INT = re.compile(r"-?[0-9]{1,20}")


def decode_query_int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    """Query parameter `name` as an integer in lo..hi: ASCII digits only (int() would also take
    " 5", "1_000" and other scripts' digits), or HTTPError 400 naming the parameter."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not _ASCII_INT.fullmatch(raw):
        raise HTTPError(400, f"query parameter {name!r} must be an integer", {name: raw})
    value = int(raw)
    if not lo <= value <= hi:
        raise HTTPError(
            400, f"query parameter {name!r} must be between {lo} and {hi}", {name: value}
        )
    return value
