from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator

import httpx
import pytest
import trio
import trio.testing

from daemon.fakes.classifier import ClassifierService, serve_classifier
from daemon.tracker.classifier import (
    REFERENCE_MODEL_VERSION,
    ClassifierUnavailable,
    HttpClassifier,
    make_classifier,
)


@contextlib.asynccontextmanager
async def running(service: ClassifierService) -> AsyncIterator[HttpClassifier]:
    async with trio.open_nursery() as nursery, httpx.AsyncClient() as http:
        shutdown = trio.Event()
        host, port = await nursery.start(
            functools.partial(serve_classifier, service, "127.0.0.1:0", shutdown=shutdown)
        )
        classifier = make_classifier(f"http://{host}:{port}", http)
        assert isinstance(classifier, HttpClassifier)
        try:
            yield classifier
        finally:
            shutdown.set()


async def test_classify_over_http() -> None:
    service = ClassifierService()
    async with running(service) as classifier:
        assert await classifier.health()
        got = await classifier.classify(7, "【洛天依原创】星河", "", ["洛天依", "原创"])
        assert got.label == 1
        assert got.model_version == REFERENCE_MODEL_VERSION
        assert len(got.probabilities) == 3
        empty = await classifier.classify(8, "", "", [])
        assert empty.label == 0
    assert service.requests == [
        {"title": "【洛天依原创】星河", "description": "N/A", "tags": "洛天依,原创", "aid": 7},
        {"title": "untitled", "description": "N/A", "tags": "empty", "aid": 8},
    ]


async def test_the_service_may_name_its_version() -> None:
    async with running(ClassifierService(model_version="3.18")) as classifier:
        assert (await classifier.classify(1, "【言和】翻唱", "", [])).model_version == "3.18"


@pytest.mark.parametrize("failure", ["unloaded", "500", "503", "garbage"])
async def test_failures_are_unavailable_never_a_label(failure: str) -> None:
    service = ClassifierService()
    if failure == "unloaded":
        service.models_loaded = False
    elif failure == "garbage":
        service.garbage()
    else:
        service.fail(status=int(failure))
    async with running(service) as classifier:
        with pytest.raises(ClassifierUnavailable):
            await classifier.classify(1, "【言和】翻唱", "", [])
        assert await classifier.health() is (failure != "unloaded")
        if failure != "unloaded":  # the next request works again
            assert (await classifier.classify(1, "【言和】翻唱", "", [])).label == 2


async def test_unreachable_and_slow_service(autojump_clock: trio.testing.MockClock) -> None:
    async with httpx.AsyncClient() as http:
        down = HttpClassifier("http://127.0.0.1:9", http)
        with pytest.raises(ClassifierUnavailable):
            await down.classify(1, "t", "d", [])
        assert not await down.health()
    service = ClassifierService(latency=31.0)
    async with running(service) as classifier:
        with pytest.raises(ClassifierUnavailable):
            await classifier.classify(1, "t", "d", [])  # the 30 s timeout
