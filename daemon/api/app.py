# The daemon's HTTP API is a list of `ApiRoute`s: each names its method, path, handler and the
# msgspec types of its body, query and answer. One list feeds both Starlette's router and
# /openapi.json, so the document cannot drift from the routes: a body's rules are on its request
# model (msgspec `Meta`), and what the running config adds or takes away (an [llm], a browser) is
# named in the model by a deployment mark and given by the route's `deployment` when the
# document is served. Areas (control, collector, jobs, tracker) each contribute `routes(daemon)`
# from their own module.
from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute, request_response
from starlette.websockets import WebSocket

from daemon import __version__
from daemon.api.edge import OPEN_PATHS, SAFE_METHODS, EdgeMiddleware, EdgePolicy, EdgeStats
from daemon.api.errors import (
    HTTPError,
    JSONResponse,
    decode_query_int,
    error_response,
    handle_http_error,
)
from daemon.config import resolve_secret
from daemon.jsonvalues import DEPLOYMENT
from daemon.logs import get_logger
from daemon.process import Daemon
from daemon.store import DISK_FULL, STORAGE_ERRORS, StoreClosed

log = get_logger("http")

Handler = Callable[[Request], Awaitable[Response]]
SocketHandler = Callable[[WebSocket], Awaitable[None]]

EDGE_ERRORS = {
    401: "API key missing or wrong (when [http] api_key_env is set)",
    403: "a browser request from another site",
    421: "Host not in [http] hosts",
    431: "request head too large",
}
"""What the edge (daemon/api/edge.py) may answer on any route but /healthz."""
CHANGE_ERRORS = {  # routes that change data (not GET)
    408: "request body not received within [http] body_timeout",
    413: "request body over [http] max_body",
    415: "a body that is not application/json",
    503: "storage unavailable (I/O error)",
    507: "storage full: the database cannot take writes",
}


IGNORED_BODY = {
    "required": False,
    "description": "not read: send none (or any JSON)",
    "content": {"application/json": {"schema": {}}},
}
"""The body of a POST, PUT or PATCH route that reads none."""


@dataclass(frozen=True)
class QueryParam:
    name: str
    description: str
    type: str = "string"
    required: bool = False
    minimum: int | None = None
    maximum: int | None = None
    enum: tuple[str, ...] | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None

    def schema(self) -> dict[str, Any]:
        """The JSON schema the handler enforces: its type, range, length or allowed values."""
        schema: dict[str, Any] = {"type": self.type}
        if self.min_length is not None:
            schema["minLength"] = self.min_length
        if self.max_length is not None:
            schema["maxLength"] = self.max_length
        if self.pattern is not None:
            schema["pattern"] = self.pattern
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.enum is not None:
            schema["enum"] = list(self.enum)
        return schema

    def read_int(self, request: Request, default: int) -> int:
        """This integer parameter of `request` within its range, or HTTPError 400."""
        assert self.minimum is not None and self.maximum is not None
        return decode_query_int(request, self.name, default, self.minimum, self.maximum)


def int_param(name: str, description: str, minimum: int, maximum: int) -> QueryParam:
    return QueryParam(name, description, "integer", minimum=minimum, maximum=maximum)


UUID_PARAM = {"type": "string", "format": "uuid"}


@dataclass(frozen=True)
class ApiRoute:
    method: str
    path: str
    handler: Handler
    summary: str
    body: Any = None
    """The msgspec type of the body: a class, or one `Annotated` with rules across its fields."""
    response: type | None = None
    query: Sequence[QueryParam] = ()
    errors: dict[int, str] = field(default_factory=dict)
    content_type: str = "application/json"
    websocket: SocketHandler | None = None
    """Served too when the same path is opened as a WebSocket (GET with Upgrade)."""
    path_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """JSON schemas of the `{name}` parts of the path (default: any string)."""
    body_required: bool = False
    ok_status: int = 200
    upload_limit: Callable[[], int] | None = None
    """An upload route: multipart/form-data accepted at the edge, with this body limit (bytes)
    instead of [http] max_body; `body` is then documented as multipart."""
    encoding: Mapping[str, Any] = field(default_factory=dict)
    """How the body's parts are sent (OpenAPI `encoding`: a part's contentType)."""
    ok_also: type | None = None
    """Another shape the success status may carry (Firecrawl answers some failures with 200 and
    `success: false`)."""
    deployment: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None
    """The schemas of the deployment marks (daemon.jsonvalues.DEPLOYMENT) in its body, as the
    running config has them; read each time the document is served."""


def deployment_schemas(routes: Sequence[ApiRoute]) -> dict[str, Any]:
    """Every route's deployment schemas, by name, as the running config has them now."""
    found: dict[str, Any] = {}
    for route in routes:
        if route.deployment is not None:
            found.update(route.deployment())
    return found


def _resolve_marks(node: Any, known: Mapping[str, Any]) -> Any:
    """`node` with each deployment-marked schema intersected with (`allOf`) a reference to the
    deployment schema it names."""
    if isinstance(node, list | tuple):
        return [_resolve_marks(x, known) for x in node]
    if not isinstance(node, dict):
        return node
    resolved = {k: _resolve_marks(v, known) for k, v in node.items() if k != DEPLOYMENT}
    if DEPLOYMENT not in node:
        return resolved
    name = node[DEPLOYMENT]
    if name not in known:
        raise KeyError(f"no route gives the deployment schema {name!r}")
    kept = {k: resolved.pop(k) for k in ("description", "default") if k in resolved}
    ref = {"$ref": f"#/components/schemas/{name}"}
    return {"allOf": [resolved, ref], **kept} if resolved else {**ref, **kept}


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"error": {"type": "string"}, "detail": {}},
    "required": ["error"],
}


def _operation(
    route: ApiRoute, schema_of: Mapping[Any, Any], needs_key: Callable[[str], bool]
) -> dict[str, Any]:
    """One route's operation object: parameters, body, its OK answer and every error status."""
    op: dict[str, Any] = {"summary": route.summary, "responses": {}}
    params = [
        {
            "name": p.name,
            "in": "query",
            "required": p.required,
            "description": p.description,
            "schema": p.schema(),
        }
        for p in route.query
    ]
    params += [
        {"name": part[1:-1], "in": "path", "required": True,
         "schema": dict(route.path_params.get(part[1:-1], {"type": "string"}))}
        for part in route.path.split("/")
        if part.startswith("{")
    ]  # fmt: skip
    if params:
        op["parameters"] = params
    if route.body is not None:
        media = "multipart/form-data" if route.upload_limit else "application/json"
        content: dict[str, Any] = {"schema": schema_of[route.body]}
        if route.encoding:
            content["encoding"] = dict(route.encoding)
        op["requestBody"] = {"required": route.body_required, "content": {media: content}}
    elif route.method in ("POST", "PUT", "PATCH"):
        op["requestBody"] = IGNORED_BODY
    ok: dict[str, Any] = {"description": "OK" if route.ok_status == 200 else "Accepted"}
    if route.response is not None:
        schema = schema_of[route.response]
        if route.ok_also is not None:
            schema = {"anyOf": [schema, schema_of[route.ok_also]]}
        ok["content"] = {route.content_type: {"schema": schema}}
    elif route.content_type != "application/json":
        ok["content"] = {route.content_type: {"schema": {"type": "string"}}}
    op["responses"][str(route.ok_status)] = ok
    errors = dict(route.errors)
    if route.query:  # QueryParam.read_int and the handlers' checks answer a bad one so
        errors.setdefault(400, "a query parameter malformed or out of range")
    if route.path not in OPEN_PATHS:
        errors = {**EDGE_ERRORS, **errors}
        if not needs_key(route.path):
            errors.pop(401)
        if route.method not in SAFE_METHODS:
            errors = {**CHANGE_ERRORS, **errors}
    if not needs_key(route.path):
        op["security"] = []
    for status, description in sorted(errors.items()):
        op["responses"][str(status)] = {
            "description": description,
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        }
    return op


def openapi_document(
    routes: Sequence[ApiRoute],
    needs_key: Callable[[str], bool] | None = None,
    deployment: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The OpenAPI document of `routes`; `needs_key(path)` says where the running config asks for
    the API key (default: everywhere but OPEN_PATHS); `deployment` gives the deployment schemas
    (default: the routes' own, read now)."""
    if needs_key is None:
        needs_key = lambda path: path not in OPEN_PATHS  # noqa: E731
    if deployment is None:
        deployment = deployment_schemas(routes)
    types = [t for r in routes for t in (r.body, r.response, r.ok_also) if t is not None]
    schemas, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    schemas = _resolve_marks(schemas, deployment)
    if clash := sorted(set(components) & set(deployment)):
        raise ValueError(f"deployment schemas named as models of the API: {clash}")
    components = {**_resolve_marks(components, deployment), **deployment}
    schema_of = dict(zip(types, schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(
            route, schema_of, needs_key
        )
    return {
        "openapi": "3.1.0",
        "info": {"title": "crawld", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def edge_policy(daemon: Daemon) -> EdgePolicy:
    """The running config's HTTP edge rules, with the API keys read from their variable."""
    http = daemon.config.http
    return EdgePolicy.from_config(http, resolve_secret(http.api_key_env, "$.http.api_key_env"))


def build_app(
    daemon: Daemon,
    routes: Sequence[ApiRoute],
    policy: EdgePolicy | None = None,
    stats: EdgeStats | None = None,
) -> Starlette:
    """One Starlette app for `routes` behind the edge checks of `policy` (default: the config's)."""
    policy = policy or edge_policy(daemon)
    uploads = {r.path: r.upload_limit for r in routes if r.upload_limit is not None}
    if uploads:
        policy = dataclasses.replace(policy, uploads={**policy.uploads, **uploads})
    served: dict[bytes, bytes] = {}

    async def openapi(request: Request) -> Response:
        # Rebuilt only when a reload changed what the deployment accepts.
        deployment = deployment_schemas(routes)
        key = msgspec.json.encode(deployment)
        if key not in served:
            served.clear()
            served[key] = msgspec.json.encode(
                openapi_document(routes, policy.needs_key, deployment)
            )
        return Response(served[key], media_type="application/json")

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(404, "not found", {"path": request.url.path})

    async def not_allowed(request: Request, exc: Exception) -> Response:
        response = error_response(405, "method not allowed", {"method": request.method})
        allow = getattr(exc, "headers", None) or {}
        if "Allow" in allow:  # RFC 9110: a 405 lists the methods the path takes
            response.headers["Allow"] = allow["Allow"]
        return response

    async def internal(request: Request, exc: Exception) -> Response:
        log.error("request failed", path=request.url.path, exc_info=exc)
        return error_response(500, "internal error", type(exc).__name__)

    async def storage_failed(request: Request, exc: Exception) -> Response:
        # The store's health (/healthz, /status) says the rest; one line per failed request is
        # at warning so a full disk does not flood the error log.
        log.warning("request failed: storage error", path=request.url.path, error=str(exc))
        if isinstance(exc, DISK_FULL):
            return error_response(507, "storage full: the database cannot take writes", str(exc))
        return error_response(503, "storage unavailable", f"{type(exc).__name__}: {exc}")

    async def disconnected(request: Request, exc: Exception) -> Response:
        log.debug("client disconnected before the answer", path=request.url.path)
        return Response(status_code=400)

    # One Starlette route per path, so a 405 names (in `Allow`) every method the path takes.
    by_path: dict[str, dict[str, Handler]] = {}
    for r in routes:
        by_path.setdefault(r.path, {})[r.method] = r.handler
    # Each route takes every method and answers 405 itself, so /v2/crawl/active never falls
    # through to /v2/crawl/{id} for a method only the latter has.
    starlette_routes: list[Route | WebSocketRoute] = [
        Route(path, _AnyMethod(_by_method(handlers))) for path, handlers in by_path.items()
    ]
    starlette_routes += [WebSocketRoute(r.path, r.websocket) for r in routes if r.websocket]
    starlette_routes.append(Route("/openapi.json", openapi, methods=["GET"]))
    starlette_routes += daemon.pages
    handlers: dict[Any, Any] = {
        HTTPError: handle_http_error,
        ClientDisconnect: disconnected,
        StoreClosed: storage_failed,
        404: not_found,
        405: not_allowed,
        500: internal,
    }
    handlers.update(dict.fromkeys(STORAGE_ERRORS, storage_failed))
    app = Starlette(
        routes=starlette_routes,
        exception_handlers=handlers,
        middleware=[
            Middleware(EdgeMiddleware, policy=policy, stats=stats, sessions=daemon.sessions)
        ],
    )
    app.state.daemon = daemon
    return app


class _AnyMethod:
    """An ASGI app for a request handler: Starlette routes it for every method (a plain function
    endpoint would be GET only)."""

    def __init__(self, handler: Handler) -> None:
        self.app = request_response(handler)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def _by_method(handlers: Mapping[str, Handler]) -> Handler:
    methods = [*handlers, "HEAD"] if "GET" in handlers else list(handlers)
    allow = ", ".join(methods)

    async def dispatch(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        handler = handlers.get(method)
        if handler is None:  # RFC 9110: a 405 lists the methods the path takes
            response = error_response(405, "method not allowed", {"method": request.method})
            response.headers["Allow"] = allow
            return response
        return await handler(request)

    return dispatch


def public_base_url(daemon: Daemon) -> str:
    """Where clients reach the API: `[http] public_url`, else http://<bind> with the bound port.

    Links in answers are built from this, never from the request's Host header, which the client
    chooses (a forged Host would send the next page's request elsewhere)."""
    http = daemon.config.http
    if http.public_url:
        return http.public_url.rstrip("/")
    host, _, port = http.bind.rpartition(":")
    if daemon.http_address is not None:
        port = str(daemon.http_address[1])
    host = host.strip("[]")
    if host in ("0.0.0.0", "::", ""):
        host = "localhost"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def public_link(request: Request, **query: Any) -> str:
    """Absolute URL of this request's path on the public base URL, with `query` replaced."""
    daemon: Daemon = request.app.state.daemon
    params = dict(request.query_params)
    params.update({k: str(v) for k, v in query.items()})
    link = public_base_url(daemon) + request.url.path
    return f"{link}?{urlencode(params)}" if params else link


def json(value: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(value, status_code=status)
