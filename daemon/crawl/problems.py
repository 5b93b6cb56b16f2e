# Bad input as the crawl area reports it. Firecrawl answers a bad request with one 400 naming
# every problem (a field path and a message each), so the readers of request bodies collect
# problems and raise one BadRequest; the HTTP layer (daemon/api/crawl.py) turns it into
# Firecrawl's 400 body. The area never imports a surface: the JSON reading it shares with the
# HTTP layer (numbers like 5.0 taken as integers) is the core's (daemon/jsonvalues.py).
from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from daemon.jsonvalues import integral_floats

T = TypeVar("T")

Problem = dict[str, Any]
"""{"path": <field path, `$` for the whole body>, "message": <what is wrong>}."""


class BadRequest(Exception):
    """A request Firecrawl would refuse with 400; `details` lists every problem found."""

    def __init__(self, details: list[Problem]) -> None:
        super().__init__("; ".join(f"{d['path']}: {d['message']}" for d in details))
        self.details = details

    @classmethod
    def at(cls, path: str, message: str) -> BadRequest:
        """A BadRequest with the one problem `message` at `path`."""
        return cls([problem(path, message)])


def problem(path: str, message: str) -> Problem:
    return {"path": path, "message": message}


# The refusals of what a deployment lacks, in one place so every room says the same true thing:
# "needs an LLM" only when `[llm]` is missing (with it, the feature works), "not supported by
# crawld" for what crawld does not do with or without one.
NO_LLM = "no [llm] is configured (add an [llm] section, docs/how-to/llm-formats.md)"


def needs_llm(what: str) -> str:
    """The 400 text of `what` (e.g. "format 'question'") asked of a crawld without `[llm]`."""
    return f"{what} needs an LLM: {NO_LLM}"


def not_supported(what: str) -> str:
    """The 400 text of `what` (e.g. "format 'branding'"), which crawld does not do at all."""
    return f"{what} is not supported by crawld"


def json_object(body: bytes) -> dict[str, Any]:
    """`body` decoded as a JSON object (empty: `{}`), integral floats as ints; BadRequest at `$`
    when it is not JSON, not an object or nested too deeply."""
    try:
        value = msgspec.json.decode(body or b"{}")
    except msgspec.DecodeError as exc:
        raise BadRequest.at("$", f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest.at("$", "request body must be a JSON object")
    try:
        normalized: dict[str, Any] = integral_floats(value)
    except RecursionError:
        raise BadRequest.at("$", "request body is nested too deeply") from None
    return normalized


def unknown_keys(raw: dict[str, Any], allowed: frozenset[str], path: str) -> list[Problem]:
    """An "unrecognized key" problem for each key of `raw` (the first 50) not in `allowed`."""
    return [
        problem(f"{path}.{key}"[:200], "unrecognized key")
        for key in sorted(raw)[:50]
        if key not in allowed
    ]


def converted(raw: dict[str, Any], type_: type[T], problems: list[Problem]) -> T:
    """`raw` converted to `type_`; else BadRequest with `problems` and the field msgspec names."""
    try:
        return msgspec.convert(raw, type_)
    except msgspec.ValidationError as exc:
        # msgspec ends its message with " - at `$.path`": that path names the field.
        message, _, where = str(exc).rpartition(" - at `")
        if message and where.endswith("`"):
            raise BadRequest([*problems, problem(where[:-1], message)]) from None
        raise BadRequest([*problems, problem("$", str(exc))]) from None
