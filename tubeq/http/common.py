"""What every route of the HTTP listener shares: the app keys, JSON errors and input checks.

Rules: every failure a client can cause answers a 4xx with a JSON body ``{"error": "..."}``
saying what was wrong, with one log line at most (the middleware turns aiohttp's own 404/405/413
into the same shape, tubeq.http.limits what aiohttp refuses before a route runs); a Redis that
is down or refusing (or --min-replicas unconfirmed) is a 503 with the same shape, plus ``ran``
(whether the change happened: false, true, or null when unknown), and one warning line; any
other 5xx is a bug, logged with its traceback. Numbers are checked against the protocol's own limits
(tubeq.protocol.limits), so a value the text protocol refuses is refused here too. A JSON body
is one object whose keys are all different and whose text is Unicode; a number in it is a JSON
number (digits are how a query string spells one, :class:`QueryValue`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import structlog
from aiohttp import web

from tubeq.protocol.limits import MAX_TUBE_NAME, TUBE_NAME_CHARS, U32_MAX, U64_MAX
from tubeq.redisio.client import RedisConnectionLost, RedisReplyError, ReplicasBehind, ran

if TYPE_CHECKING:
    from tubeq.server.context import ServerContext
    from tubeq.server.process import Server

log = structlog.get_logger("tubeq.http")

SERVER: Final[web.AppKey[Server]] = web.AppKey("server")

_TUBE_NAME: Final = re.compile(
    "(?!-)[" + re.escape(TUBE_NAME_CHARS.decode()) + "]{1," + str(MAX_TUBE_NAME) + "}")
_DIGITS: Final = re.compile("[0-9]{1,20}")
# The query parameter that carries a token where no header can (a browser opening the
# dashboard); every route takes it, so it is read apart from the routes' options.
TOKEN_PARAM: Final = "token"
# How much of a JSON key a 400 repeats.
MAX_ECHOED_KEY: Final = 40

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpError(Exception):
    """A client error: ``status`` and the message of the JSON error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BodyTimeout(TimeoutError):
    """A request's body did not arrive within ``--http-body-timeout`` (tubeq.http.limits sets it
    on the body's stream, so the route's read raises it). A TimeoutError, so aiohttp's own
    reading of the rest of an unread body ends on it too."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"request body not received within {seconds:g} s")
        self.seconds = seconds


class QueryValue(str):
    """An option's value from the query string: text, in which a number is spelt in digits;
    a JSON body's numbers are JSON numbers, its strings stay strings."""

    __slots__ = ()


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """HttpError, aiohttp's HTTP exceptions (unknown route, wrong method, body too large) and
    unexpected failures all answer with a JSON error body."""
    try:
        return await handler(request)
    except HttpError as exc:
        return error_response(exc.status, exc.message)
    except BodyTimeout as exc:  # the connection closes: the rest of the body is not awaited
        log.info("http request timed out", phase="body", timeout_s=exc.seconds,
                 method=request.method, path=request.path, peer=request.remote)
        response = error_response(408, str(exc))
        response.force_close()
        return response
    except web.RequestPayloadError as exc:  # a body aiohttp cannot frame (chunked, length)
        log.info("http request refused", status=400, error=str(exc), method=request.method,
                 path=request.path, peer=request.remote)
        response = error_response(400, f"bad request body: {exc}")
        response.force_close()
        return response
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(413, f"request body too large: {exc.text}")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error_response(exc.status, exc.reason.lower())
        raise
    except (RedisConnectionLost, RedisReplyError, ReplicasBehind) as exc:
        # Redis is down, refusing, or its replicas did not confirm: "ran" says whether the
        # request's change happened, as far as tubeq knows (protocol.md, "Redis stalls").
        log.warning("http request failed on redis", method=request.method, path=request.path,
                    error=repr(exc))
        what = "not confirmed by replicas" if isinstance(exc, ReplicasBehind) else (
            "redis unavailable")
        return web.json_response({"error": f"{what}: {exc}", "ran": ran(exc)}, status=503)
    except Exception:
        log.exception("http handler failed", method=request.method, path=request.path)
        return error_response(500, "internal error")


def server_of(request: web.Request) -> Server:
    return request.app[SERVER]


def namespace_of(request: web.Request) -> ServerContext:
    """The namespace a request acts in: the server's own without an access file; with one
    (``--auth``), the namespace of its token, ``Authorization: Bearer <token>`` (or a ``token``
    query parameter, which is how the dashboard in a browser carries it), else a 401."""
    ctx = server_of(request).ctx
    assert ctx is not None
    gate = ctx.gate
    if gate is None:
        return ctx
    token = _credential(request)
    if not token:
        raise HttpError(401, "this server requires a token: Authorization: Bearer <token>")
    target = gate.by_token(token)
    if target is None:
        raise HttpError(401, "unknown token")
    return target


def _credential(request: web.Request) -> str:
    """The request's token: ``Authorization: Bearer <token>``, else the ``token`` query
    parameter (the header wins when both are given); "" when neither."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        token = request.query.get(TOKEN_PARAM, "")
    return token.strip()


def require_metrics_reader(request: web.Request) -> None:
    """With an access file, /metrics takes a scraper's token (its ``[scrapers]``, good for
    /metrics alone) or a token of the default namespace (the one whose tubes it reports; the
    rest is the process's own): no token or an unknown one is a 401, a token of another
    namespace a 403. Without one it is open, as the rest of the listener."""
    server = server_of(request)
    if server.ctx is None or server.ctx.gate is None:
        return
    if server.ctx.gate.config.is_scraper(_credential(request)):
        return
    if namespace_of(request) is not server.ctx:
        raise HttpError(403, "/metrics takes a token of the default namespace (whose tubes it "
                             "reports)")


def tube_name(text: str) -> str:
    """A tube name as the protocol accepts it, else a 400."""
    if _TUBE_NAME.fullmatch(text) is None:
        raise HttpError(400, f"bad tube name {text[:MAX_TUBE_NAME + 1]!r}: 1 to {MAX_TUBE_NAME} "
                             "of A-Z a-z 0-9 - + / ; . $ _ ( ), not starting with -")
    return text


def job_id(text: str) -> int:
    """A job id from the path (1 to 2**64-1), else a 400."""
    if _DIGITS.fullmatch(text) is None or not 0 < int(text) <= U64_MAX:
        raise HttpError(400, f"bad job id {text[:24]!r}: a whole number from 1 to {U64_MAX}")
    return int(text)


def unsigned(name: str, value: Any, maximum: int = U32_MAX, minimum: int = 0) -> int:
    """A whole number minimum..maximum from JSON (a number) or a query string (digits), else a
    400."""
    if isinstance(value, QueryValue) and _DIGITS.fullmatch(value):
        value = int(value)
    if type(value) is not int or not minimum <= value <= maximum:
        spelt = " (a JSON number, not a string)" if type(value) is str else ""
        raise HttpError(400, f"{name} must be a whole number from {minimum} to {maximum}{spelt}")
    return value


async def read_options(request: web.Request, allowed: frozenset[str], *,
                       json_body: bool = True) -> dict[str, Any]:
    """The request's options: its query string, plus the keys of its JSON object body when
    ``json_body`` (a POST sends either or both; a key given twice or not in ``allowed`` is a
    400, so a misspelt option never passes silently). The query's ``token`` is the credential
    (:func:`namespace_of`), never an option of a route."""
    options: dict[str, Any] = {key: QueryValue(value) for key, value in request.query.items()}
    if len(options) != len(request.query):
        raise HttpError(400, "a query parameter is given twice")
    options.pop(TOKEN_PARAM, None)
    if json_body and request.can_read_body:
        for key, value in (await json_object(request)).items():
            if key in options:
                raise HttpError(400, f"{key!r} is given both in the query and in the body")
            options[key] = value
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise HttpError(400, f"unknown option {unknown[0][:MAX_ECHOED_KEY]!r} (allowed: "
                             f"{', '.join(sorted(allowed)) or 'none'})")
    return options


async def json_object(request: web.Request) -> Mapping[str, Any]:
    """The body as a JSON object (UTF-8, as JSON is, whatever charset the request names), else
    a 400: also for a key given twice in an object, a lone surrogate escape (text that is not
    Unicode: ``"\\ud800"``) and nesting past Python's recursion limit."""
    body = await request.read()
    try:
        value = json.loads(body.decode(), object_pairs_hook=_json_members)
    except RecursionError:
        raise HttpError(400, "body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # not UTF-8, not JSON
        raise HttpError(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise HttpError(400, "body must be a JSON object")
    return value


def _json_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """One JSON object of a body, as json.loads meets it (nested ones first)."""
    members: dict[str, Any] = {}
    for key, value in pairs:
        if key in members:
            raise HttpError(400, f"{key[:MAX_ECHOED_KEY]!r} is given twice in the body")
        if not _is_unicode(key) or (isinstance(value, str) and not _is_unicode(value)):
            raise HttpError(400, "body is not valid JSON text: a lone surrogate escape "
                                 "(\\ud800-\\udfff not in a pair) is no Unicode character")
        members[key] = value
    return members


def _is_unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def body_fields(body: bytes) -> dict[str, Any]:
    """A job body in JSON: ``body`` as text when it is UTF-8 (else null), and always
    ``body_base64``, so binary bodies survive."""
    try:
        text: str | None = body.decode()
    except UnicodeDecodeError:
        text = None
    return {"body": text, "body_base64": base64.b64encode(body).decode()}
