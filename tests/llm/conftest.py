from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
import trio

from daemon.config_types import dec_hook
from daemon.fakes.openai_compat import OpenAICompatService, serve_openai_compat
from daemon.llm.config import LlmConfig


@dataclass
class Sim:
    service: OpenAICompatService
    base_url: str

    def config(self, **overrides: Any) -> LlmConfig:
        raw: dict[str, Any] = {"base_url": self.base_url, "model": "sim-model", **overrides}
        return msgspec.convert(raw, LlmConfig, dec_hook=dec_hook)


@pytest.fixture
async def sim(nursery: trio.Nursery) -> AsyncIterator[Sim]:
    service = OpenAICompatService()
    shutdown = trio.Event()
    host, port = await nursery.start(
        functools.partial(serve_openai_compat, service, "127.0.0.1:0", shutdown=shutdown)
    )
    yield Sim(service, f"http://{host}:{port}/v1")
    shutdown.set()
