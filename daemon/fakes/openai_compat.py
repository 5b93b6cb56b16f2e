# An OpenAI-compatible chat-completions server for tests, the LLM benchmark and `crawld demo`
# (POST /v1/chat/completions, GET /v1/models), speaking the wire format crawld meets in OpenAI,
# vLLM, Ollama and llama.cpp: `response_format` json_schema / json_object, forced `tools` calls,
# `usage`, 429 with Retry-After, error envelopes `{"error": {"message", "type", ...}}`.
#
# Its answers are derived deterministically from the page text it is sent, so a test can check
# that the right content reached the model: for a schema, each string property `p` takes the value
# of a line `p: value` of the page (else the page's first line), numbers the first number on such
# a line (else the page's word count), booleans whether `p` occurs, arrays of strings the page's
# list items; without a schema the answer is {"title", "words", "sha"} of the page. A summary is
# "Summary of <first line>: <n> words." Faults on demand: 429 storms, 5xx, slow answers, invalid
# JSON, a refused structured-output mode; and scripted answers (`reply`), for a test that needs
# the model to say something in particular (a passage the page does not hold). It counts
# requests and the most it had in flight.
#
#   python -m daemon.fakes.openai_compat --bind 127.0.0.1:8547 --latency 0.3-0.6
from __future__ import annotations

import argparse
import hashlib
import json
import re
import time
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from daemon.fakes.serving import run_standalone, serve_fake

PAGE_MARK = "Page content:\n"
MODEL = "crawld-sim-1"


def page_text(messages: list[dict[str, Any]]) -> str:
    """The page content crawld put in the messages (the first user message holding it)."""
    for message in messages:
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str) and PAGE_MARK in content:
            return content.split(PAGE_MARK, 1)[1]
    return ""


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def _first_line(text: str) -> str:
    lines = _lines(text)
    return lines[0].lstrip("#").strip() if lines else ""


def _field_line(text: str, name: str) -> str | None:
    found = re.search(rf"(?im)^[\s*#-]*{re.escape(name)}\s*[:=]\s*(.+?)\s*$", text)
    return found.group(1) if found else None


def value_for(schema: Any, text: str, name: str = "", defs: dict[str, Any] | None = None) -> Any:
    """A value following `schema`, read from `text` (see the module comment)."""
    defs = defs if defs is not None else {}
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema:
        ref = str(schema["$ref"]).rsplit("/", 1)[-1]
        return value_for(defs.get(ref, {}), text, name, defs)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return value_for(options[0], text, name, defs)
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: value_for(v, text, k, defs) for k, v in props.items()}
    if kind == "array":
        items = [ln[2:].strip() for ln in _lines(text) if ln.startswith(("- ", "* "))][:10]
        item_schema = schema.get("items") or {"type": "string"}
        if isinstance(item_schema, dict) and item_schema.get("type", "string") == "string":
            return items
        return [value_for(item_schema, item, name, defs) for item in items[:3]]
    if kind in ("number", "integer"):
        line = _field_line(text, name) if name else None
        found = re.search(r"-?\d+(?:\.\d+)?", line or "")
        if found:
            number = float(found.group(0))
            return int(number) if kind == "integer" else number
        return len(text.split())
    if kind == "boolean":
        return bool(name) and name.lower() in text.lower()
    if kind == "null":
        return None
    return (_field_line(text, name) if name else None) or _first_line(text)


def free_answer(text: str) -> dict[str, Any]:
    return {
        "title": _first_line(text),
        "words": len(text.split()),
        "sha": hashlib.sha256(text.encode()).hexdigest()[:12],
    }


def summary_of(text: str) -> str:
    return f"Summary of {_first_line(text)[:80]}: {len(text.split())} words."


def _tokens(text: str) -> int:
    return len(text) // 4 + 1


def _error(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
) -> Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


class OpenAICompatService:
    """State and controls of the simulator; `app` serves it."""

    def __init__(
        self,
        *,
        latency: tuple[float, float] = (0.0, 0.0),
        refuse: frozenset[str] = frozenset(),
        model: str = MODEL,
    ) -> None:
        self.latency = latency
        """Seconds each answer takes, spread over [lo, hi] by a hash of the page."""
        self.refuse = set(refuse)
        """Structured-output modes answered with 400 (json_schema, json_object, tools)."""
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.delays: list[float] = []
        """Seconds each answered request waited before its answer (its latency)."""
        self.elapsed: list[float] = []
        """Seconds from receiving each request to handing its answer back (the chosen delay
        plus whatever the simulator's own process added: on a busy host, more)."""
        self.first_at: float | None = None
        self.last_at: float | None = None
        """Wall-clock times of the first request and the last answer (since the last reset)."""
        self._faults: list[tuple[str, Any]] = []
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/_sim/stats", self._stats, methods=["GET"]),
                Route("/_sim/reset", self._reset, methods=["POST"]),
            ]
        )

    # -- controls --------------------------------------------------------------------------

    def rate_limit(self, times: int = 1, retry_after: float | None = 1.0) -> None:
        """Answer the next `times` requests with 429 (and Retry-After when given)."""
        self._faults.extend([("429", retry_after)] * times)

    def fail(self, times: int = 1, status: int = 500) -> None:
        """Answer the next `times` requests with HTTP `status`."""
        self._faults.extend([("status", status)] * times)

    def invalid_json(self, times: int = 1) -> None:
        """Answer the next `times` requests with text that is not JSON."""
        self._faults.extend([("invalid", None)] * times)

    def reply(self, content: str, times: int = 1) -> None:
        """Answer the next `times` requests with `content` as the model's text (or the forced
        tool call's arguments), whatever the page says."""
        self._faults.extend([("reply", content)] * times)

    def slow(self, times: int = 1, seconds: float = 10.0) -> None:
        """Make the next `times` requests take `seconds` before their answer."""
        self._faults.extend([("slow", seconds)] * times)

    def reset(self) -> None:
        self._faults.clear()
        self.requests.clear()
        self.delays.clear()
        self.elapsed.clear()
        self.max_in_flight = 0
        self.first_at = self.last_at = None

    def stats(self) -> dict[str, Any]:
        """What a benchmark in another process reads (GET /_sim/stats)."""
        return {
            "requests": len(self.requests),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "mean_latency": sum(self.delays) / len(self.delays) if self.delays else 0.0,
            "mean_elapsed": sum(self.elapsed) / len(self.elapsed) if self.elapsed else 0.0,
            "busy_seconds": sum(self.elapsed),
            "window_seconds": (self.last_at or 0.0) - (self.first_at or 0.0),
            "first_at": self.first_at,
        }

    # -- serving ---------------------------------------------------------------------------

    async def _stats(self, request: Request) -> Response:
        return JSONResponse(self.stats())

    async def _reset(self, request: Request) -> Response:
        self.reset()
        return JSONResponse(self.stats())

    async def _models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "crawld"}],
            }
        )

    async def _chat(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "'messages' is a required property")
        self.requests.append(body)
        if self.first_at is None:
            self.first_at = time.time()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        started = time.monotonic()
        try:
            return await self._answer(body)
        finally:
            self.in_flight -= 1
            self.elapsed.append(time.monotonic() - started)
            self.last_at = time.time()

    async def _answer(self, body: dict[str, Any]) -> Response:
        messages = body["messages"]
        text = page_text(messages)
        fault = self._faults.pop(0) if self._faults else None
        lo, hi = self.latency
        delay = lo + (hi - lo) * (
            int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        )
        if fault is not None and fault[0] == "slow":
            delay = float(fault[1])
        if delay > 0:
            await trio.sleep(delay)
        self.delays.append(delay)
        if fault is not None and fault[0] == "429":
            headers = {} if fault[1] is None else {"Retry-After": f"{fault[1]:g}"}
            return _error(429, "Rate limit reached for requests", "requests", headers)
        if fault is not None and fault[0] == "status":
            return _error(
                int(fault[1]), "The server had an error processing your request.", "server_error"
            )
        response_format = body.get("response_format") or {}
        tools: list[Any] = body.get("tools") or []
        mode = "tools" if tools else response_format.get("type", "text")
        if mode in self.refuse:
            return _error(
                400,
                f"response_format type {mode!r} is not supported by this model"
                if mode != "tools"
                else "tools are not supported by this model",
            )
        schema: Any = None
        if mode == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema")
        elif mode == "tools":
            schema = tools[0]["function"].get("parameters")
        if fault is not None and fault[0] == "reply":
            answer = str(fault[1])
        elif mode == "text":
            answer = summary_of(text)
        elif (
            schema is not None
            and schema != {"type": "object"}
            and (schema.get("properties") != {} or "$defs" in schema)
        ):
            answer = json.dumps(value_for(schema, text, defs=schema.get("$defs")))
        else:
            answer = json.dumps(free_answer(text))
        if fault is not None and fault[0] == "invalid":
            answer = "Sure! Here is the data: {title: " + _first_line(text)[:40]
        message: dict[str, Any] = {"role": "assistant", "content": answer, "refusal": None}
        finish = "stop"
        if mode == "tools":
            message["content"] = None
            message["tool_calls"] = [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": tools[0]["function"]["name"], "arguments": answer},
                }
            ]
            finish = "tool_calls"
        prompt_tokens = sum(_tokens(str(m.get("content") or "")) for m in messages)
        completion_tokens = _tokens(answer)
        return JSONResponse(
            {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model") or self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )


async def serve_openai_compat(
    service: OpenAICompatService,
    bind: str,
    *,
    shutdown: trio.Event | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `service` on `bind` until `shutdown` is set; started() gets the bound (host, port)."""
    await serve_fake(service.app, bind, "sim.llm", shutdown=shutdown, task_status=task_status)


def _latency(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition("-")
    return float(lo), float(hi or lo)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m daemon.fakes.openai_compat",
        description="Serve an OpenAI-compatible chat-completions simulator.",
    )
    parser.add_argument("--bind", default="127.0.0.1:8547")
    parser.add_argument("--latency", default="0", help="seconds, or a range like 0.3-0.6")
    args = parser.parse_args(argv)
    service = OpenAICompatService(latency=_latency(args.latency))
    run_standalone(
        service.app,
        args.bind,
        "sim.llm",
        lambda host, port: f"OpenAI-compatible simulator on http://{host}:{port}/v1",
    )


if __name__ == "__main__":
    main()
