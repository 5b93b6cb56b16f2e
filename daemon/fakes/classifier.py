# A classifier service with the reference's contract (ml/api: `POST /classify`, `GET /health`),
# answering with the built-in rules, so the tracker's HTTP classifier path is tested over real
# sockets: the service can be unhealthy (503 "models not loaded"), fail the next requests with a
# chosen status, answer garbage, or be slow; it counts what it was asked.
#
#   python -m daemon.fakes.classifier --bind 127.0.0.1:8544
from __future__ import annotations

import argparse
from typing import Any

import msgspec
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from daemon.api.errors import HTTPError, JSONResponse, handle_http_error, read_json_body
from daemon.fakes.serving import run_standalone, serve_fake
from daemon.tracker.classifier import classify_by_rules


class _Classify(msgspec.Struct, kw_only=True):
    title: str
    description: str
    tags: str
    aid: int | None = None


class ClassifierService:
    """State and controls of the fake service; `app` serves it."""

    def __init__(self, *, model_version: str | None = None, latency: float = 0.0) -> None:
        self.model_version = model_version
        """Sent as `model_version` in each answer when set (the reference sends none)."""
        self.latency = latency
        self.models_loaded = True
        self.requests: list[dict[str, Any]] = []
        self._failures: list[int] = []
        self._garbage = 0
        self.app = Starlette(
            routes=[
                Route("/classify", self._classify, methods=["POST"]),
                Route("/health", self._health, methods=["GET"]),
            ],
            exception_handlers={HTTPError: handle_http_error},
        )

    def fail(self, times: int = 1, status: int = 500) -> None:
        """Answer the next `times` classifications with HTTP `status`."""
        self._failures.extend([status] * times)

    def garbage(self, times: int = 1) -> None:
        """Answer the next `times` classifications with a body that is not the contract's."""
        self._garbage += times

    async def _classify(self, request: Request) -> Response:
        body = await read_json_body(request, _Classify, empty_ok=False)
        self.requests.append(msgspec.to_builtins(body))
        if self.latency:
            await trio.sleep(self.latency)
        if not self.models_loaded:
            return JSONResponse({"detail": "Models not loaded"}, status_code=503)
        if self._failures:
            return JSONResponse({"detail": "Internal error"}, status_code=self._failures.pop(0))
        if self._garbage:
            self._garbage -= 1
            return JSONResponse({"result": "song"})
        tags = [] if body.tags == "empty" else body.tags.split(",")
        got = classify_by_rules(body.title, body.description, tags)
        answer: dict[str, Any] = {
            "label": got.label,
            "probabilities": got.probabilities,
            "aid": body.aid,
        }
        if self.model_version is not None:
            answer["model_version"] = self.model_version
        return JSONResponse(answer)

    async def _health(self, request: Request) -> Response:
        return JSONResponse(
            {
                "status": "healthy" if self.models_loaded else "models_not_loaded",
                "models_loaded": self.models_loaded,
            }
        )


async def serve_classifier(
    service: ClassifierService,
    bind: str,
    *,
    shutdown: trio.Event | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `service` on `bind` until `shutdown` is set; started() gets the bound (host, port)."""
    await serve_fake(
        service.app, bind, "sim.classifier", shutdown=shutdown, task_status=task_status
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m daemon.fakes.classifier",
        description="Serve the built-in rules behind the reference classifier's HTTP contract.",
    )
    parser.add_argument("--bind", default="127.0.0.1:8544")
    args = parser.parse_args(argv)
    service = ClassifierService()

    run_standalone(
        service.app,
        args.bind,
        "sim.classifier",
        lambda host, port: (
            f"classifier service on http://{host}:{port} (POST /classify, GET /health)"
        ),
    )


if __name__ == "__main__":
    main()
