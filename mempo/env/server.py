"""The retrieval server: any `Retriever` over HTTP, speaking Search-R1's `/retrieve` API
(``POST /retrieve``, ``POST /access``, ``GET /health``; JSON in, JSON out; the shapes are stated at
each endpoint in `create_app`). Binds 127.0.0.1 by default; port 0 picks a free port (the readiness
line and `RetrieverServer.url` say which). fastapi and uvicorn are imported inside the functions
that need them.

The serving machinery is shared with the agent server (`mempo.serve`): `BodyLimit` (the request
body bound, pure ASGI), `uvicorn_server` (the connection bounds), `bind_socket` / `socket_url`,
`AppServer` (any ASGI app on a background thread) and `serve_app` (any app until SIGINT/SIGTERM).
"""
import asyncio
import errno
import ipaddress
import json
import resource
import socket
import signal
import sys
import threading
import time
from typing import Any, Callable, Optional

from mempo.env.local import LocalRetriever
from mempo.env.retriever import (
    DEFAULT_TOPK, MAX_QUERY_CHARS, DocumentNotFoundError, InvalidRequestError, PageOutOfRangeError, Retriever,
    RetrieverError, check_doc_id, check_page, check_page_chars, check_queries, check_topk,
)

__all__ = ["create_app", "RetrieverServer", "serve", "AppServer", "serve_app", "BodyLimit", "uvicorn_server",
           "bind_socket", "socket_url", "SERVER_OPTIONS", "is_loopback", "DEFAULT_HOST", "DEFAULT_PORT",
           "DEFAULT_TOPK_MAX", "DEFAULT_MAX_QUERIES", "DEFAULT_MAX_PAGE_CHARS", "DEFAULT_MAX_BODY_BYTES",
           "DEFAULT_MAX_DOC_CHARS", "DEFAULT_MAX_RESPONSE_CHARS", "DEFAULT_REQUEST_TIMEOUT", "DEFAULT_KEEP_ALIVE",
           "DEFAULT_MAX_CONNECTIONS", "FD_LOG_INTERVAL", "max_connections_for"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_TOPK_MAX = 100
DEFAULT_MAX_QUERIES = 256
DEFAULT_MAX_PAGE_CHARS = 1_000_000
DEFAULT_MAX_BODY_BYTES = 4 << 20
DEFAULT_MAX_DOC_CHARS = 25_000
DEFAULT_MAX_RESPONSE_CHARS = 10_000_000
DEFAULT_REQUEST_TIMEOUT = 10.0  # seconds a connection may take to send one whole request (headers and body)
DEFAULT_KEEP_ALIVE = 5          # seconds an idle keep-alive connection is kept (uvicorn timeout_keep_alive)
DEFAULT_MAX_CONNECTIONS = 1000  # open connections beyond which requests get 503 (uvicorn limit_concurrency)
FD_LOG_INTERVAL = 10.0          # out of file descriptors: at most one log line per this many seconds


class _ResponseTooLarge(Exception):
    """The answer would carry more document characters than the app's max_response_chars."""


def _error_body(kind: str, message: str, **extra) -> bytes:
    return json.dumps({"detail": message, "error": kind, **extra}).encode("utf-8")


def _retriever_error(status: int, kind: str, message: str) -> bytes:
    return _error_body(kind, message)


class BodyLimit:
    """ASGI middleware: read a request body up to `limit` bytes (413 beyond), then replay it.

    error_body(status, kind, message) -> bytes: the JSON body of a refusal (default: the retrieval
    server's ``{"detail", "error"}``); kinds: ``invalid_request`` (400, malformed Content-Length),
    ``request_too_large`` (413)."""

    def __init__(self, app, limit: int, error_body: Callable[[int, str, str], bytes] = _retriever_error):
        self.app, self.limit, self.error_body = app, limit, error_body

    async def _reject(self, send, status: int, kind: str, message: str) -> None:
        body = self.error_body(status, kind, message)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        too_large = f"request body over the limit of {self.limit} bytes"
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reject(send, 400, "invalid_request", "malformed Content-Length header")
                    return
                if declared > self.limit:
                    await self._reject(send, 413, "request_too_large", too_large)
                    return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._reject(send, 413, "request_too_large", too_large)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _validation_message(errors) -> str:
    """One line from pydantic/FastAPI validation errors: 'topk: Input should be a valid integer; ...'."""
    parts = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ()) if part != "body"]
        where = ".".join(loc) if loc else "body"
        if error.get("type") == "json_invalid":
            where = "body"
            msg = "not valid JSON"
        else:
            msg = error.get("msg", "invalid")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts) or "invalid request"


def create_app(retriever: Retriever, *, default_topk: int = DEFAULT_TOPK, topk_max: int = DEFAULT_TOPK_MAX,
               max_queries: int = DEFAULT_MAX_QUERIES, max_query_chars: int = MAX_QUERY_CHARS,
               max_page_chars: int = DEFAULT_MAX_PAGE_CHARS, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               max_doc_chars: int = DEFAULT_MAX_DOC_CHARS, max_response_chars: int = DEFAULT_MAX_RESPONSE_CHARS):
    """A FastAPI app serving `retriever` (endpoints: see the comment above each route below).

    Errors are JSON ``{"detail": "<message>", "error": "<kind>"}``, never a 500 for a bad request:
    - 400 invalid_request: a body that cannot be decoded at all;
    - 422 invalid_request: bad JSON, not an object, missing field, wrong type (strict: "5" is not an
      integer), unknown field, empty query list, blank query, over max_queries / max_query_chars,
      topk < 1 or > topk_max, page < 0, page_chars < 1 or > max_page_chars;
    - 404 document_not_found (404 not_found for an unknown route), 416 page_out_of_range (the body
      also carries "num_pages"), 413 request_too_large (body over max_body_bytes);
    - 413 response_too_large: the answer would carry more than `max_response_chars` characters of
      document titles and texts (counted after the per-document cut, titles twice in /retrieve as
      they are sent twice); nothing is sent but the error, so a response stays bounded by about
      max_response_chars characters whatever the corpus holds;
    - 503 retriever_unavailable: a backing retriever failed.
    The limits are these keywords (`mempo serve-retriever` flags: --max-doc-chars, ...).
    """
    # reason: `import mempo.env` and `mempo --help` stay without fastapi, pydantic and starlette
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import Response
    from pydantic import BaseModel, ConfigDict
    from starlette.exceptions import HTTPException

    if not 1 <= default_topk <= topk_max:
        raise ValueError(f"need 1 <= default_topk ({default_topk}) <= topk_max ({topk_max})")
    limits = {"max_queries": max_queries, "max_query_chars": max_query_chars, "max_page_chars": max_page_chars,
              "max_body_bytes": max_body_bytes, "max_doc_chars": max_doc_chars,
              "max_response_chars": max_response_chars}
    for name, value in limits.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    class RetrieveRequest(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")
        queries: list[str]
        topk: Optional[int] = None
        return_scores: bool = False

    class AccessRequest(BaseModel):
        model_config = ConfigDict(strict=True, extra="forbid")
        doc_id: str
        page: int = 0
        page_chars: Optional[int] = None

    def json_response(obj, status: int = 200) -> Response:
        return Response(json.dumps(obj, ensure_ascii=False).encode("utf-8"), status_code=status,
                        media_type="application/json")

    def error_response(status: int, kind: str, message: str, **extra) -> Response:
        return Response(_error_body(kind, message, **extra), status_code=status, media_type="application/json")

    app = FastAPI(title="mempo retriever", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, limit=max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return error_response(422, "invalid_request", _validation_message(exc.errors()))

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        kinds = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}
        message = str(exc.detail)
        if exc.status_code == 400 and "parsing the body" in message:
            message = "body: not valid JSON (could not decode the request body)"
        return error_response(exc.status_code, kinds.get(exc.status_code, "http_error"), message)

    @app.exception_handler(InvalidRequestError)
    async def _invalid_args(request: Request, exc: InvalidRequestError):
        return error_response(422, "invalid_request", str(exc))

    @app.exception_handler(DocumentNotFoundError)
    async def _not_found(request: Request, exc: DocumentNotFoundError):
        return error_response(404, "document_not_found", str(exc))

    @app.exception_handler(PageOutOfRangeError)
    async def _out_of_range(request: Request, exc: PageOutOfRangeError):
        return error_response(416, "page_out_of_range", str(exc), num_pages=exc.num_pages)

    @app.exception_handler(RetrieverError)
    async def _unavailable(request: Request, exc: RetrieverError):
        return error_response(503, "retriever_unavailable", str(exc))

    @app.exception_handler(_ResponseTooLarge)
    async def _too_large(request: Request, exc: _ResponseTooLarge):
        return error_response(413, "response_too_large", str(exc))

    def check_response_size(chars: int, advice: str) -> None:
        if chars > max_response_chars:
            raise _ResponseTooLarge(f"the answer would hold {chars} characters of documents, over the limit of "
                                    f"{max_response_chars} (max_response_chars); {advice}")

    # GET /health: 200 {"status": "ok", "retriever": "bm25", "num_docs": N, "default_topk", "topk_max",
    # "max_queries", "max_query_chars", "page_chars", "max_doc_chars", "max_response_chars"}. The app
    # exists only once the index is loaded, so a 200 here means ready.
    @app.get("/health")
    def health():
        return json_response({
            "status": "ok", "retriever": retriever.name, "num_docs": retriever.num_docs,
            "default_topk": default_topk, "topk_max": topk_max, "max_queries": max_queries,
            "max_query_chars": max_query_chars, "page_chars": retriever.page_chars,
            "max_doc_chars": max_doc_chars, "max_response_chars": max_response_chars,
        })

    # POST /retrieve (Search-R1 ``retrieval_server.py`` compatible):
    #   request:  {"queries": ["q1", "q2"], "topk": 5, "return_scores": true}
    #             topk optional (null/absent -> default_topk), return_scores optional (false)
    #   response: {"result": [[{"document": {"id": "d7", "title": "T", "contents": "T\n<text>"},
    #                           "score": 12.3}, ...],      # query 1, best first, at most topk hits
    #                          [...]]}                     # query 2
    #             with return_scores false each entry is the bare document {"id", "title", "contents"}.
    # "contents" is the title, a newline, then the text (Search-R1's wiki-18 convention, so clients
    # that split the first line off as the title work unchanged). Title and text are each cut to
    # max_doc_chars (default 25,000; keep it at least the search tool's ``doc_chars`` so its
    # "truncated" flags stay right); /access reads the rest.
    # The size is checked before the answer is built: a local retriever (`LocalRetriever.rank`)
    # ranks first and the documents' saved lengths give the answer's exact size, so a refused
    # request reads no document, and an accepted one holds one whole document at a time besides
    # the answer (at most max_response_chars characters of cut titles and texts). Any other
    # retriever's hits are counted as they are cut, and the building stops at the bound.
    advice = "ask for fewer queries per request or a smaller topk"

    def sent_chars(title_chars: int, text_chars: int) -> int:  # the title is sent twice: "title", "contents"
        return 2 * min(title_chars, max_doc_chars) + min(text_chars, max_doc_chars)

    def ranked_hits(queries: list[str], topk: int) -> list:
        """Per query, an iterable of its hits, built one at a time for a local retriever."""
        if not isinstance(retriever, LocalRetriever):
            return retriever.search(queries, topk)
        ranked = retriever.rank(queries, topk)
        check_response_size(sum(sent_chars(*retriever.doc_chars(row)) for rows in ranked for row, _ in rows), advice)
        return [(retriever.hit(row, score) for row, score in rows) for rows in ranked]

    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest):
        queries = check_queries(request.queries, max_queries=max_queries, max_query_chars=max_query_chars)
        topk = default_topk if request.topk is None else check_topk(request.topk, topk_max=topk_max)
        result, chars = [], 0
        for hits in ranked_hits(queries, topk):
            entries = []
            for hit in hits:
                chars += sent_chars(len(hit.title), len(hit.text))
                check_response_size(chars, advice)  # before the cut copies are made
                title, text = hit.title[:max_doc_chars], hit.text[:max_doc_chars]
                document = {"id": hit.doc_id, "title": title, "contents": title + "\n" + text}
                entries.append({"document": document, "score": hit.score} if request.return_scores else document)
            result.append(entries)
        return json_response({"result": result})

    # POST /access:
    #   request:  {"doc_id": "d7", "page": 0, "page_chars": 25000}   # page (0-based), page_chars optional
    #   response: {"doc_id": "d7", "title": "T", "page": 0, "num_pages": 3, "text": "<at most page_chars>"}
    @app.post("/access")
    def access(request: AccessRequest):
        page_chars = retriever.page_chars if request.page_chars is None else request.page_chars
        check_page_chars(page_chars, limit=max(max_page_chars, retriever.page_chars))
        page = retriever.access(check_doc_id(request.doc_id), check_page(request.page), page_chars)
        title = page.title[:max_doc_chars]
        check_response_size(len(title) + len(page.text), "ask for a smaller page_chars")
        return json_response({"doc_id": page.doc_id, "title": title, "page": page.page,
                              "num_pages": page.num_pages, "text": page.text})

    return app


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one."""
    family, type_, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def socket_url(sock: socket.socket) -> str:
    """The http URL a listening socket is reached at."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def max_connections_for(requested: Optional[int] = None) -> int:
    """The connection limit actually used: `requested` (default DEFAULT_MAX_CONNECTIONS), lowered so
    that half of the process's file descriptors (RLIMIT_NOFILE soft limit; at most 64) stay
    free for the index, the logs and accepting the connections that are answered 503."""
    wanted = DEFAULT_MAX_CONNECTIONS if requested is None else requested
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - min(64, soft // 2)))


_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
         b"content-length: %d\r\n\r\n%s")


def _protocol_with_request_timeout(request_timeout: float, max_connections: int, error_body: Callable):
    """uvicorn's h11 protocol, closing a connection that takes over `request_timeout` seconds to send
    one whole request (uvicorn times out idle keep-alive connections only: a connection that never
    sends, or trickles its headers or body, would hold its file descriptor for ever), and answering
    a connection past `max_connections` open ones with 503 at once, then closing it (its descriptor
    is free again before the process runs out)."""
    # reason: as fastapi in `create_app` (h11 comes with uvicorn)
    from uvicorn.protocols.http.h11_impl import H11Protocol, h11

    receiving = (h11.IDLE, h11.SEND_BODY)

    class TimedH11Protocol(H11Protocol):
        _request_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                body = error_body(503, "server_busy", f"{max_connections} connections are open "
                                                      f"(max_connections); retry later")
                transport.write(_BUSY % (len(body), body))
                transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            if self._request_timer is None:
                self._request_timer = self.loop.call_later(request_timeout, self._request_timed_out)

        def _disarm(self) -> None:
            if self._request_timer is not None:
                self._request_timer.cancel()
                self._request_timer = None

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state in receiving:
                self._arm()  # a new request (on a kept-alive connection too) starts its clock
            super().data_received(data)
            if self.conn.their_state not in receiving:  # the request is complete (or the connection done)
                self._disarm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _request_timed_out(self) -> None:
            self._request_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return TimedH11Protocol


def _fd_exhaustion_handler(interval: float = FD_LOG_INTERVAL, name: str = "mempo serve-retriever"):
    """An asyncio exception handler: errors of running out of file descriptors (accept() failing
    with EMFILE/ENFILE, which asyncio reports with a traceback per attempt, and the retries of
    accepting it schedules, one per attempt, failing in turn) become one stderr line per `interval`
    seconds with their count; every other error goes to the default handler."""
    state = {"last": -float("inf"), "count": 0}

    def handle(loop, context) -> None:
        error = context.get("exception")
        exhausted = isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE)
        if not exhausted and "_start_serving" not in repr(context.get("handle")):
            loop.default_exception_handler(context)
            return
        state["count"] += 1
        now = time.monotonic()
        if now - state["last"] >= interval:
            print(f"{name}: out of file descriptors ({state['count']} failure(s) to accept a "
                  f"connection since the last such line); waiting connections are refused until others close "
                  f"(requests past the connection limit get 503; raise `ulimit -n` or lower --max-connections)",
                  file=sys.stderr, flush=True)
            state["last"], state["count"] = now, 0

    return handle


def uvicorn_server(app, log_level: str, *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                   keep_alive: int = DEFAULT_KEEP_ALIVE, max_connections: Optional[int] = None,
                   name: str = "mempo serve-retriever",
                   error_body: Callable[[int, str, str], bytes] = _retriever_error):
    """A uvicorn server for `app` with the connection bounds: `request_timeout` seconds to send one
    request, `keep_alive` seconds idle between requests, at most `max_connections_for(max_connections)`
    connections (one more is answered 503, body ``error_body(503, "server_busy", message)``, and
    closed at once), request headers of at most 16 kB (h11's default, kept: answered 400 beyond),
    and out-of-descriptor errors logged (prefixed `name`) once per FD_LOG_INTERVAL seconds."""
    import uvicorn  # reason: as fastapi in `create_app`

    if isinstance(request_timeout, bool) or not isinstance(request_timeout, (int, float)) or not request_timeout > 0:
        raise ValueError(f"request_timeout must be a number of seconds > 0, got {request_timeout!r}")
    for option, value in (("keep_alive", keep_alive), ("max_connections", max_connections)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{option} must be an integer >= 1, got {value!r}")
    limit = max_connections_for(max_connections)
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off",
                            timeout_graceful_shutdown=5, timeout_keep_alive=keep_alive, limit_concurrency=limit,
                            http=_protocol_with_request_timeout(float(request_timeout), limit, error_body),
                            backlog=128)
    handler = _fd_exhaustion_handler(name=name)

    class Server(uvicorn.Server):
        async def serve(self, sockets=None) -> None:
            asyncio.get_running_loop().set_exception_handler(handler)
            await super().serve(sockets=sockets)

    return Server(config)


#: `uvicorn_server`'s connection-bound keywords (the rest of a server's options are its app's)
SERVER_OPTIONS = ("request_timeout", "keep_alive", "max_connections")


def _split_options(options: dict) -> tuple[dict, dict]:
    """(create_app keywords, `uvicorn_server` keywords) from one dict of options."""
    server = {key: options[key] for key in SERVER_OPTIONS if key in options}
    return {key: value for key, value in options.items() if key not in server}, server


class AppServer:
    """An ASGI app served by uvicorn (`uvicorn_server`, its keywords in `server_options`) on a
    background thread (tests, benchmarks, notebooks). `make_app()` builds the app when the server
    starts. ``with AppServer(...) as server: server.url ...``; the default port 0 picks a free port.
    `stop` shuts the server down and joins its thread."""

    def __init__(self, make_app: Callable[[], Any], host: str = DEFAULT_HOST, port: int = 0, *,
                 log_level: str = "warning", thread_name: str = "mempo-server", **server_options):
        self.make_app, self.host, self.port = make_app, host, port
        self.log_level, self.thread_name, self.server_options = log_level, thread_name, server_options
        self.url: Optional[str] = None
        self._server = None
        self._sock: Optional[socket.socket] = None
        self._thread: Optional[threading.Thread] = None

    def start(self, timeout: float = 30.0) -> "AppServer":
        """Bind, start serving, and return once the server accepts requests (else RuntimeError)."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        sock = self._sock = bind_socket(self.host, self.port)
        self.url = socket_url(sock)
        self._server = uvicorn_server(self.make_app(), self.log_level, **self.server_options)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"{self.thread_name} {self.url}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server on {self.url} did not start within {timeout:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the server to exit, then wait for its thread (forcing exit after `timeout` s)."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._server.force_exit = True
            self._thread.join(timeout)
        if self._sock is not None:
            self._sock.close()
        self._server, self._thread, self._sock = None, None, None

    def __enter__(self) -> "AppServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


class RetrieverServer(AppServer):
    """`create_app(retriever)` served by uvicorn on a background thread (tests, benchmarks, notebooks);
    `app_options` as `serve` takes them.

    ``with RetrieverServer(retriever) as server: HTTPRetriever(server.url)...``; the default port 0
    picks a free port. `stop` shuts the server down and joins its thread.
    """

    def __init__(self, retriever: Retriever, host: str = DEFAULT_HOST, port: int = 0, *,
                 log_level: str = "warning", **app_options):
        self.retriever, self.app_options = retriever, app_options
        app_keywords, server_options = _split_options(app_options)
        super().__init__(lambda: create_app(retriever, **app_keywords), host, port, log_level=log_level,
                         thread_name="mempo-retriever", **server_options)

    def start(self, timeout: float = 30.0) -> "RetrieverServer":
        super().start(timeout)
        return self


def serve_app(app: Any, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
              on_ready: Optional[Callable[[str], None]] = None, log_level: str = "warning",
              what: str = "the retriever", **server_options) -> None:
    """Serve the ASGI `app` in the calling thread until SIGINT/SIGTERM (graceful shutdown; after
    SIGINT it raises KeyboardInterrupt, so the command always exits 130 then).

    `on_ready(url)` is called once the socket accepts requests. Raises OSError if the address is
    taken. Warns on stderr (naming `what` is served) when `host` is not a loopback address.
    `server_options`: `uvicorn_server`'s keywords.
    """
    if not is_loopback(host):
        print(f"warning: serving {what} on non-loopback address {host}: anyone who can reach "
              f"this machine can query it", file=sys.stderr, flush=True)
    sock = bind_socket(host, port)
    url = socket_url(sock)
    server = uvicorn_server(app, log_level, **server_options)
    finished = threading.Event()
    received: list[int] = []
    handle_exit = server.handle_exit

    def record_exit(sig: int, frame: Any) -> None:  # uvicorn installs `server.handle_exit` as the handler
        received.append(sig)
        handle_exit(sig, frame)

    server.handle_exit = record_exit

    def announce():
        while not server.started:
            if finished.wait(0.01):
                return
        if on_ready is not None:
            on_ready(url)

    watcher = threading.Thread(target=announce, name="mempo-server readiness", daemon=True)
    watcher.start()
    try:
        server.run(sockets=[sock])
    finally:
        finished.set()
        watcher.join(1.0)
        sock.close()
    if signal.SIGINT in received:
        # uvicorn re-raises the signal after its graceful shutdown, but under asyncio.run that only
        # becomes a KeyboardInterrupt when it lands before the serving task has finished: make it one
        raise KeyboardInterrupt


def serve(retriever: Retriever, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
          on_ready: Optional[Callable[[str], None]] = None, log_level: str = "warning", **app_options) -> None:
    """Serve `retriever` in the calling thread until SIGINT/SIGTERM (`serve_app`: graceful shutdown;
    after SIGINT it raises KeyboardInterrupt, so `mempo serve-retriever` always exits 130 then).

    `on_ready(url)` is called once the socket accepts requests. Raises OSError if the address is
    taken. Warns on stderr when `host` is not a loopback address. `app_options`: `create_app`'s
    keywords and the connection bounds request_timeout (default DEFAULT_REQUEST_TIMEOUT s),
    keep_alive (DEFAULT_KEEP_ALIVE s) and max_connections (`max_connections_for`).
    """
    app_keywords, server_options = _split_options(app_options)
    serve_app(create_app(retriever, **app_keywords), host, port, on_ready=on_ready, log_level=log_level,
              what="the retriever", **server_options)
