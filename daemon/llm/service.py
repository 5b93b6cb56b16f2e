# LlmService: the one object through which crawld talks to models (see daemon/llm/__init__.py for
# what callers may rely on). A call goes: cache lookup → content cut to max_input_tokens → for
# each attempt: rate limits reserved (requests, estimated prompt tokens), a max_concurrency slot,
# one POST bounded by `timeout` → the answer parsed (and for JSON checked against the schema,
# with one repair round-trip) → usage counted → the value cached.
#
# httpx directly, not the `openai` package: crawld needs its own retry loop anyway (the slot is
# given back while waiting, Retry-After is capped by the operator, a mode the server refused is
# remembered), the per-request overhead and import cost are lower, and every OpenAI-compatible
# server only needs the one JSON POST (docs/how-to/llm-formats.md has the figures).
from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import trio

from daemon import config as cfgmod
from daemon.clock import EpochClock, wall_ms
from daemon.llm import metrics, rules
from daemon.llm import store as llmstore
from daemon.llm.config import DEFAULT_PROVIDER, STRONGEST_FIRST, LlmConfig, ProviderConfig
from daemon.llm.types import (
    LLM_BAD_OUTPUT,
    LLM_BAD_REQUEST,
    LLM_NOT_CONFIGURED,
    LLM_RATE_LIMITED,
    LLM_REFUSED,
    LLM_TIMEOUT,
    LLM_UNAVAILABLE,
    LlmError,
    LlmResult,
    Usage,
)
from daemon.logs import get_logger
from daemon.net import tls
from daemon.net.ratelimit import RateLimiter
from daemon.redact import MASK, redact_text
from daemon.store import DB_ERRORS, Store, StoreClosed

_STORE_FAILURES: tuple[type[BaseException], ...] = (*DB_ERRORS, StoreClosed)

log = get_logger("llm")

MAX_ANSWER_BYTES = 8 * 1024 * 1024
"""Largest answer body read from an endpoint."""


class _Transient(Exception):
    """An attempt that may succeed when tried again: 429, 5xx, timeout, connection error."""

    def __init__(self, code: str, message: str, outcome: str, asked: float | None = None):
        super().__init__(message)
        self.code, self.message, self.outcome, self.asked = code, message, outcome, asked


class _ModeRefused(Exception):
    """The server does not take the structured-output mode this attempt used."""


@dataclass
class _Answer:
    body: Any
    usage: Usage


@dataclass
class Provider:
    """One configured endpoint and what crawld keeps towards it."""

    name: str
    config: ProviderConfig
    client: httpx.AsyncClient
    slots: trio.CapacityLimiter
    requests: RateLimiter | None
    tokens: RateLimiter | None
    refused: set[str] = field(default_factory=set)
    """Structured-output modes this server refused ("auto" skips them from then on)."""
    usage: Usage = field(default_factory=Usage)
    calls: int = 0

    def modes(self) -> list[str]:
        """The structured-output modes to try, in order."""
        mode = self.config.structured_output
        if mode != "auto":
            return [mode]
        return [m for m in STRONGEST_FIRST if m not in self.refused]


def _new_provider(
    name: str, config: ProviderConfig, key: str | None, transport: httpx.AsyncBaseTransport | None
) -> Provider:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    n = config.max_concurrency
    client = httpx.AsyncClient(
        headers=headers,
        timeout=httpx.Timeout(float(config.timeout)),
        limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
        follow_redirects=False,
        trust_env=False,
        verify=tls.verifying(trust_env=False),
        transport=transport,
    )
    rpm, tpm = config.requests_per_minute, config.tokens_per_minute
    return Provider(
        name=name,
        config=config,
        client=client,
        slots=trio.CapacityLimiter(n),
        requests=RateLimiter(rpm / 60.0, burst=max(1, rpm // 60)) if rpm else None,
        tokens=RateLimiter(tpm / 60.0, burst=tpm) if tpm else None,
    )


class LlmService:
    """The daemon's model client (daemon.llm), with or without `[llm]`."""

    def __init__(
        self,
        config: LlmConfig | None,
        store: Store | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock_ms: EpochClock = wall_ms,
        env: Callable[[str], str | None] | None = None,
    ) -> None:
        self.store = store
        self.clock_ms = clock_ms
        self._transport = transport
        self._env = env
        self.config: LlmConfig | None = None
        self.providers: dict[str, Provider] = {}
        self._retired: list[httpx.AsyncClient] = []
        self.cache_hits = 0
        self.configure(config)

    # -- configuration ---------------------------------------------------------------------

    def _key(self, env_name: str | None, path: str) -> str | None:
        if env_name is None:
            return None
        if self._env is not None:
            value = self._env(env_name)
            if value is None:
                raise cfgmod.ConfigError(
                    f"environment variable {env_name} (named at `{path}`) is not set"
                )
            return value
        return cfgmod.resolve_secret(env_name, path)

    def configure(self, config: LlmConfig | None) -> None:
        """Apply a new `[llm]` (None: no LLM). A provider with unchanged settings keeps its
        limiters, slots and what its server refused. ConfigError (no change): an API key unset."""
        wanted: dict[str, tuple[ProviderConfig, str | None]] = {}
        if config is not None:
            for name in config.provider_names():
                provider = config.provider(name)
                assert provider is not None
                path = (
                    "$.llm.api_key_env"
                    if name == DEFAULT_PROVIDER
                    else (f"$.llm.providers.{name}.api_key_env")
                )
                wanted[name] = (provider, self._key(provider.api_key_env, path))
        kept: dict[str, Provider] = {}
        for name, (provider_cfg, key) in wanted.items():
            old = self.providers.get(name)
            if old is not None and _same(old.config, provider_cfg) and not key_changed(old, key):
                kept[name] = old
            else:
                kept[name] = _new_provider(name, provider_cfg, key, self._transport)
        for name, old in self.providers.items():
            if kept.get(name) is not old:
                self._retired.append(old.client)
        self.providers = kept
        self.config = config

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            for client in [*self._retired, *(p.client for p in self.providers.values())]:
                await client.aclose()
        self._retired.clear()

    def configured(self, provider: str | None = None) -> bool:
        """Whether a call to `provider` (None: the default) can be made."""
        return (provider or DEFAULT_PROVIDER) in self.providers

    def provider_names(self) -> list[str]:
        return list(self.providers)

    def _provider(self, name: str | None) -> Provider:
        provider = self.providers.get(name or DEFAULT_PROVIDER)
        if provider is None:
            if not self.providers:
                raise LlmError(LLM_NOT_CONFIGURED, "no [llm] section in the configuration")
            raise LlmError(
                LLM_NOT_CONFIGURED,
                f"no LLM provider named {name!r}; configured: {', '.join(self.providers)}",
            )
        return provider

    # -- the calls -------------------------------------------------------------------------

    async def extract_json(
        self,
        content: str,
        *,
        schema: dict[str, Any] | None,
        prompt: str | None,
        provider: str | None = None,
    ) -> LlmResult:
        """Structured data from `content`: a JSON value following `schema` (an object when there
        is none), asked with `prompt`. LlmError when there is none after the retries and one
        repair round-trip."""
        p = self._provider(provider)
        try:
            result = await self._cached_call(p, "json", content, schema, prompt)
        except LlmError as exc:
            metrics.calls.labels(p.name, "json", exc.code).inc()
            raise
        metrics.calls.labels(p.name, "json", "cached" if result.cached else "ok").inc()
        return result

    async def summarize(self, content: str, *, provider: str | None = None) -> LlmResult:
        """A short plain-text summary of `content`."""
        p = self._provider(provider)
        try:
            result = await self._cached_call(p, "summary", content, None, None)
        except LlmError as exc:
            metrics.calls.labels(p.name, "summary", exc.code).inc()
            raise
        metrics.calls.labels(p.name, "summary", "cached" if result.cached else "ok").inc()
        return result

    async def read_image(self, data_url: str, *, provider: str | None = None) -> str:
        """The text of an image (a PNG/JPEG/WebP data URL) read by the vision model, as markdown."""
        p = self._provider(provider)
        body = rules.json_body(p.config.model, rules.image_messages(data_url), "text", None,
                               max_tokens=p.config.max_output_tokens, temperature=0.0)  # fmt: skip
        text, _ = rules.answer_text((await self._post(p, body)).body, "text")
        return (text or "").strip()

    async def _cached_call(
        self,
        p: Provider,
        kind: str,
        content: str,
        schema: dict[str, Any] | None,
        prompt: str | None,
    ) -> LlmResult:
        cfg = p.config
        overhead = rules.estimate_tokens((prompt or "") + json.dumps(schema or {})) + 200
        fitted, warning = rules.fit_content(content, max(cfg.max_input_tokens - overhead, 64))
        key = rules.cache_key(kind, cfg.model, prompt, schema, fitted)
        hit = await self._lookup(key)
        if hit is not None:
            self.cache_hits += 1
            return LlmResult(hit, Usage(), True, p.name, cfg.model, warning)
        if kind == "json":
            value, usage = await self._json(p, fitted, schema, prompt)
        else:
            value, usage = await self._summary(p, fitted)
        await self._remember(key, kind, cfg.model, value, usage)
        return LlmResult(value, usage, False, p.name, cfg.model, warning)

    async def _json(
        self, p: Provider, content: str, schema: dict[str, Any] | None, prompt: str | None
    ) -> tuple[Any, Usage]:
        total = Usage()
        modes = p.modes()
        if not modes:
            raise LlmError(
                LLM_BAD_REQUEST,
                f"the server at [llm] provider {p.name!r} refused "
                "every structured-output mode (json_schema, tools, json_object)",
            )
        for mode in modes:
            messages = rules.json_messages(
                content, prompt, schema, schema_in_text=mode == "json_object"
            )
            try:
                answer = await self._post(p, self._json_body(p, messages, mode, schema))
            except _ModeRefused:
                if p.config.structured_output != "auto":
                    raise LlmError(
                        LLM_BAD_REQUEST,
                        f"the server refused structured_output "
                        f'{mode!r}; try "auto" or another mode',
                    ) from None
                p.refused.add(mode)
                log.warning(
                    "LLM server refused a structured-output mode; trying the next",
                    provider=p.name,
                    mode=mode,
                )
                continue
            total += answer.usage
            value, problem = self._read_json(answer.body, mode, schema)
            if problem is None:
                return value, total
            # One repair round-trip: the model sees its answer and what was wrong with it.
            text, _ = rules.answer_text(answer.body, mode)
            messages = [
                *messages,
                {"role": "assistant", "content": (text or "")[:20_000]},
                {"role": "user", "content": rules.REPAIR.format(problem=problem)},
            ]
            try:
                answer = await self._post(p, self._json_body(p, messages, mode, schema))
            except _ModeRefused:
                raise LlmError(
                    LLM_BAD_OUTPUT, f"the model's answer was unusable: {problem}"
                ) from None
            total += answer.usage
            value, problem2 = self._read_json(answer.body, mode, schema)
            if problem2 is None:
                return value, total
            metrics.requests.labels(p.name, "bad_output").inc()
            raise LlmError(LLM_BAD_OUTPUT, f"the model's answer was unusable twice: {problem2}")
        raise LlmError(
            LLM_BAD_REQUEST,
            f"the server at [llm] provider {p.name!r} refused every "
            "structured-output mode (json_schema, tools, json_object)",
        )

    def _read_json(
        self, body: Any, mode: str, schema: dict[str, Any] | None
    ) -> tuple[Any, str | None]:
        text, refusal = rules.answer_text(body, mode)
        if refusal:
            raise LlmError(LLM_REFUSED, f"the model refused: {str(refusal)[:300]}")
        if rules.finish_reason(body) == "length":
            return None, "the answer was cut at max_output_tokens"
        if text is None:
            return None, "the answer held no content"
        value, problem = rules.parse_json(text)
        if problem is not None:
            return None, problem
        if rules.wrapped_root(schema, mode) and isinstance(value, dict) and "items" in value:
            value = value["items"]
        problem = rules.validation_problem(value, schema)
        return value, problem

    @staticmethod
    def _json_body(
        p: Provider, messages: list[dict[str, str]], mode: str, schema: dict[str, Any] | None
    ) -> dict[str, Any]:
        return rules.json_body(
            p.config.model,
            messages,
            mode,
            schema,
            max_tokens=p.config.max_output_tokens,
            temperature=p.config.temperature,
        )

    async def _summary(self, p: Provider, content: str) -> tuple[str, Usage]:
        body = rules.json_body(
            p.config.model,
            rules.summary_messages(content),
            "text",
            None,
            max_tokens=p.config.max_output_tokens,
            temperature=p.config.temperature,
        )
        try:
            answer = await self._post(p, body)
        except _ModeRefused:  # "text" is never refused as a mode
            raise LlmError(LLM_BAD_REQUEST, "the server refused the request") from None
        text, refusal = rules.answer_text(answer.body, "text")
        if refusal:
            raise LlmError(LLM_REFUSED, f"the model refused: {str(refusal)[:300]}")
        if not text or not text.strip():
            raise LlmError(LLM_BAD_OUTPUT, "the model's answer held no summary")
        return text.strip(), answer.usage

    # -- one request, retried --------------------------------------------------------------

    async def _post(self, p: Provider, body: dict[str, Any]) -> _Answer:
        cfg = p.config
        payload = json.dumps(body, ensure_ascii=False).encode()
        estimate = rules.estimate_tokens(json.dumps(body.get("messages", [])))
        last: _Transient | None = None
        for attempt in range(cfg.retries + 1):
            if attempt:
                assert last is not None
                wait = rules.backoff(
                    attempt, last.asked, float(cfg.retry_backoff_max), random.random()
                )
                await trio.sleep(wait)
            if p.requests is not None:
                await p.requests.acquire()
            if p.tokens is not None:
                await p.tokens.acquire(min(estimate, cfg.tokens_per_minute))
            try:
                answer = await self._attempt(
                    p, payload, body.get("response_format"), "tools" in body
                )
            except _Transient as exc:
                last = exc
                continue
            if p.tokens is not None:
                p.tokens.charge(
                    answer.usage.completion_tokens + max(answer.usage.prompt_tokens - estimate, 0)
                )
            return answer
        assert last is not None
        raise LlmError(last.code, f"{last.message} (after {cfg.retries + 1} attempts)")

    async def _attempt(
        self, p: Provider, payload: bytes, response_format: Any, tools: bool
    ) -> _Answer:
        cfg = p.config
        mode = "tools" if tools else (response_format or {}).get("type", "text")
        async with p.slots:
            metrics.in_flight.labels(p.name).inc()
            started = time.monotonic()
            try:
                with trio.move_on_after(float(cfg.timeout)) as scope:
                    status, headers, raw = await self._send(p, payload)
                if scope.cancelled_caught:
                    metrics.requests.labels(p.name, "timeout").inc()
                    raise _Transient(
                        LLM_TIMEOUT, f"no answer within {float(cfg.timeout):g}s", "timeout"
                    )
            finally:
                metrics.in_flight.labels(p.name).dec()
        elapsed = time.monotonic() - started
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if status == 200 and isinstance(body, dict):
            metrics.latency.labels(p.name).observe(elapsed)
            metrics.requests.labels(p.name, "ok").inc()
            prompt_tokens, completion_tokens = rules.usage_of(body)
            usage = Usage(prompt_tokens, completion_tokens)
            p.usage += usage
            p.calls += 1
            metrics.tokens.labels(p.name, "in").inc(prompt_tokens)
            metrics.tokens.labels(p.name, "out").inc(completion_tokens)
            return _Answer(body, usage)
        message = self._scrub(p, rules.error_message(body, raw.decode("utf-8", "replace")))
        if status == 200:
            metrics.requests.labels(p.name, "server_error").inc()
            raise _Transient(
                LLM_UNAVAILABLE, "the server's answer was not a JSON object", "server_error"
            )
        if status == 429:
            metrics.requests.labels(p.name, "rate_limited").inc()
            raise _Transient(
                LLM_RATE_LIMITED,
                f"rate limited by the server (429): {message}",
                "rate_limited",
                rules.retry_after(headers, time.time()),
            )
        if rules.refuses_mode(status, message, mode):
            metrics.requests.labels(p.name, "refused_mode").inc()
            raise _ModeRefused(message)
        if status >= 500 or status == 408:
            metrics.requests.labels(p.name, "server_error").inc()
            raise _Transient(
                LLM_UNAVAILABLE,
                f"server error {status}: {message}",
                "server_error",
                rules.retry_after(headers, time.time()),
            )
        metrics.requests.labels(p.name, "bad_request").inc()
        raise LlmError(LLM_BAD_REQUEST, f"the server refused the request ({status}): {message}")

    @staticmethod
    def _scrub(p: Provider, message: str) -> str:
        """A server's error text fit for a page warning or a log: the API key (some servers
        quote what they were sent) and URLs' credentials masked."""
        auth = p.client.headers.get("Authorization", "")
        key = auth.removeprefix("Bearer ")
        if key and len(key) >= 4:
            message = message.replace(key, MASK)
        return redact_text(message)

    async def _send(self, p: Provider, payload: bytes) -> tuple[int, dict[str, str], bytes]:
        try:
            async with p.client.stream("POST", p.config.chat_url, content=payload) as response:
                raw = b""
                async for chunk in response.aiter_bytes():
                    raw += chunk
                    if len(raw) > MAX_ANSWER_BYTES:
                        raise _Transient(
                            LLM_UNAVAILABLE,
                            f"answer larger than {MAX_ANSWER_BYTES} bytes",
                            "server_error",
                        )
                headers = {k.lower(): v for k, v in response.headers.items()}
                return response.status_code, headers, raw
        except httpx.TimeoutException:
            metrics.requests.labels(p.name, "timeout").inc()
            raise _Transient(
                LLM_TIMEOUT, f"no answer within {float(p.config.timeout):g}s", "timeout"
            ) from None
        except httpx.HTTPError as exc:
            metrics.requests.labels(p.name, "unreachable").inc()
            raise _Transient(
                LLM_UNAVAILABLE, f"cannot reach the server: {type(exc).__name__}", "unreachable"
            ) from None

    # -- cache -----------------------------------------------------------------------------

    def _ttl_ms(self) -> int:
        return int(float(self.config.cache_ttl) * 1000) if self.config is not None else 0

    async def _lookup(self, key: str) -> Any:
        if self.store is None or self._ttl_ms() <= 0:
            return None
        now = self.clock_ms()
        try:
            row = await self.store.read(lambda c: llmstore.cached(c, key, now))
        except _STORE_FAILURES as exc:
            log.warning("LLM cache not readable; asking the model", error=str(exc))
            return None
        if row is None:
            return None
        try:
            return msgspec.json.decode(row[0])
        except msgspec.DecodeError:
            return None

    async def _remember(self, key: str, kind: str, model: str, value: Any, usage: Usage) -> None:
        ttl = self._ttl_ms()
        if self.store is None or ttl <= 0:
            return
        now, text = self.clock_ms(), json.dumps(value, ensure_ascii=False)
        pair = (usage.prompt_tokens, usage.completion_tokens)
        try:
            await self.store.write(
                lambda c: llmstore.remember(c, key, kind, model, text, pair, now, ttl)
            )
        except _STORE_FAILURES as exc:
            log.warning("LLM answer not cached", error=str(exc))

    async def purge(self) -> int:
        """Drop expired cache entries (a batch); how many went."""
        if self.store is None:
            return 0
        now = self.clock_ms()
        return int(await self.store.write(lambda c: llmstore.purge(c, now)))

    # -- reporting -------------------------------------------------------------------------

    def usage(self) -> dict[str, dict[str, int]]:
        """Tokens counted since start, per provider."""
        return {
            name: {
                "requests": p.calls,
                "promptTokens": p.usage.prompt_tokens,
                "completionTokens": p.usage.completion_tokens,
                "totalTokens": p.usage.total_tokens,
            }
            for name, p in self.providers.items()
        }

    def status(self) -> dict[str, Any]:
        return {
            "configured": bool(self.providers),
            "cache_hits": self.cache_hits,
            "providers": {
                name: {
                    "model": p.config.model,
                    "structured_output": p.config.structured_output,
                    "refused_modes": sorted(p.refused),
                    "in_flight": int(p.slots.borrowed_tokens),
                    "max_concurrency": p.config.max_concurrency,
                    "requests": p.calls,
                    "prompt_tokens": p.usage.prompt_tokens,
                    "completion_tokens": p.usage.completion_tokens,
                }
                for name, p in self.providers.items()
            },
        }


def _same(a: ProviderConfig, b: ProviderConfig) -> bool:
    """Equal endpoint settings (an LlmConfig's own cache/providers fields aside)."""
    fields = ProviderConfig.__struct_fields__
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def key_changed(provider: Provider, key: str | None) -> bool:
    current = provider.client.headers.get("Authorization")
    return current != (f"Bearer {key}" if key else None)


__all__ = ["LlmService", "Provider"]
