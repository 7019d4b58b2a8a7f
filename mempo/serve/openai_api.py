"""The agent behind OpenAI's chat API: ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health`` (a FastAPI app over an `mempo.serve.agent.AgentService`).

A request's last ``user`` message is the question (earlier turns, system messages and the OpenAI
``tools`` are ignored: the agent has its own system prompt and tools). Honoured fields:
``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens`` (tokens per round),
``max_turns`` (an extension: rounds), ``stream``, ``stream_options.include_usage``, ``n`` (1 only);
any other field is ignored, as OpenAI servers do. ``model`` must name the served model.

Non-streaming answer: a ``chat.completion`` whose message is the final ``<answer>`` text (``""``
when the agent gave none), ``finish_reason`` ``"stop"`` (answered, or ended without an action) or
``"length"`` (out of rounds or tokens), ``usage`` summed over the rounds, and the extra field
``agent``: ``{"finish_reason", "turns", "seconds", "rounds": [AgentRound, ...]}``. Streaming:
server-sent events ``data: <chunk>`` in OpenAI's chunk format: a role chunk, one chunk per finished
round with ``choices: []`` and the extra field ``agent_round``, the answer as one content chunk,
a finish chunk (with ``agent`` without the rounds), a usage chunk when asked, ``data: [DONE]``;
``: ping`` comments every ``ping_s`` seconds while a round runs (client read timeouts count between
bytes). No ``id:``, ``retry:`` or ``event:`` lines (the openai client misreads them).

Errors are OpenAI error objects ``{"error": {"message", "type", "param", "code"}}``: 400 malformed
body, non-JSON, missing or empty user message, a question a QA file could not hold (over
`mempo.env.data.MAX_QUESTION_CHARS` characters, or not encodable: a lone surrogate such as
``"\\ud800"``; `check_question`, lines allowed), bad field (``param`` names it); 401 wrong or missing
API key (every route but ``/health``); 404 unknown model or route; 413 body over
``max_body_bytes``; 429 more than ``max_in_flight`` requests in flight (``Retry-After``); 504 the
request's deadline passed; 500 the agent failed (``x-should-retry: false`` on 500 and 504: a retry
would run the whole episode again). After a stream has started an error is sent in-band
(``data: {"error": ...}`` then ``[DONE]``). A retriever failing mid-episode is a tool error in the
rounds (``tool_ok: false``), never an HTTP error. A client that disconnects cancels its episode.
"""

import asyncio
import hmac
import json
import time
import uuid
from typing import Any, Callable, Optional

from mempo.env.data import DataError, check_question
from mempo.env.server import DEFAULT_HOST, SERVER_OPTIONS, AppServer, BodyLimit, serve_app
from mempo.serve.defaults import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_IN_FLIGHT, DEFAULT_PING_S, DEFAULT_PORT
from mempo.serve.agent import AgentAnswer, AgentError, AgentOptions, AgentService, DeadlineExceeded
from mempo.utils.jsonl import loads_bounded

__all__ = ["create_app", "AgentServer", "serve_agent", "openai_error_body", "completion_finish_reason"]


#: error kinds (OpenAI ``type``) per status
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          500: "server_error", 503: "server_error", 504: "timeout_error"}
_NO_RETRY = {"x-should-retry": "false"}


class _RequestError(Exception):
    """An OpenAI-style error response raised inside a handler."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[dict[str, str]] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers or {}


def openai_error_body(status: int, code: Optional[str], message: str, param: Optional[str] = None) -> bytes:
    """``{"error": {"message", "type", "param", "code"}}`` as JSON bytes (type from the status)."""
    error = {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param, "code": code}
    return json.dumps({"error": error}, ensure_ascii=False).encode("utf-8")


def completion_finish_reason(agent_reason: str) -> str:
    """OpenAI's ``finish_reason`` of an episode: ``"length"`` when it ran out of rounds or tokens,
    else ``"stop"`` (answered, or the model ended its turn without an action)."""
    return "length" if agent_reason in ("turn_limit", "token_budget") else "stop"


class _ApiKey:
    """Pure ASGI middleware (a ``@app.middleware`` would hide client disconnects from the
    handlers): every HTTP request but ``GET /health`` needs ``Authorization: Bearer <key>``."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.key = app, key.encode("utf-8")

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            given = b""
            for name, value in scope.get("headers", ()):
                if name == b"authorization" and value[:7].lower() == b"bearer ":
                    given = value[7:].strip()
            if not hmac.compare_digest(given, self.key):
                body = openai_error_body(401, "invalid_api_key", "missing or incorrect API key (send "
                                                                 "'Authorization: Bearer <key>')")
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _text_of(content: Any, where: str) -> str:
    """A message's text: a string, or the ``text`` of its ``{"type": "text"}`` parts, joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise _RequestError(400, f"{where}: a content part must be an object", param=where)
            if part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    raise _RequestError(400, f"{where}: a text part needs a 'text' string", param=where)
                texts.append(part["text"])
        return "\n".join(texts)
    raise _RequestError(400, f"{where}: must be a string, a list of content parts or null", param=where)


def _question(body: dict) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _RequestError(400, "'messages' must be a non-empty list of messages", param="messages")
    question, where = None, "messages"
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _RequestError(400, f"messages[{i}] must be an object with a 'role' string", param=f"messages[{i}]")
        if message["role"] == "user":
            where = f"messages[{i}].content"
            question = _text_of(message.get("content"), where)
    if question is None:
        raise _RequestError(400, "no user message: the last 'user' message is the agent's question", param="messages")
    if not question.strip():
        raise _RequestError(400, "the last user message is empty", param="messages")
    try:  # what a QA file's question may hold, lines apart (the message is the prompt as it is)
        return check_question(question, where, one_line=False)
    except DataError as error:
        raise _RequestError(400, str(error), param=where) from None


def _number(body: dict, name: str, *, integer: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise _RequestError(400, f"'{name}' must be {'an integer' if integer else 'a number'}, got {value!r}",
                            param=name)
    return value


def _options(body: dict, service: AgentService) -> AgentOptions:
    max_tokens = _number(body, "max_completion_tokens", integer=True)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", integer=True)
    options = AgentOptions(temperature=_number(body, "temperature"), top_p=_number(body, "top_p"),
                           max_new_tokens=max_tokens, max_turns=_number(body, "max_turns", integer=True))
    try:
        service.check_options(options)
    except ValueError as error:
        name = str(error).split(" ", 1)[0]
        param = {"max_new_tokens": "max_tokens"}.get(name, name)
        raise _RequestError(400, str(error).replace("max_new_tokens", "max_tokens"), param=param) from None
    return options


def _parse(raw: bytes, model_id: str, service: AgentService) -> tuple[str, AgentOptions, bool, bool]:
    """(question, options, stream, include_usage) of a request body, or a `_RequestError`."""
    try:
        body = loads_bounded(raw, "the request body")
    except (ValueError, UnicodeDecodeError) as error:
        raise _RequestError(400, f"{error}" if "request body" in str(error) else "the request body is not UTF-8 JSON",
                            code="invalid_json") from None
    if not isinstance(body, dict):
        raise _RequestError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _RequestError(400, "'model' must name the served model", param="model")
    if model != model_id:
        raise _RequestError(404, f"the model {model!r} does not exist; this server serves {model_id!r}",
                            param="model", code="model_not_found")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _RequestError(400, f"'stream' must be true or false, got {stream!r}", param="stream")
    n = body.get("n")
    if n is not None and n != 1:
        raise _RequestError(400, f"'n' must be 1 (one answer per request), got {n!r}", param="n")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise _RequestError(400, "'stream_options' must be an object", param="stream_options")
    include_usage = stream_options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise _RequestError(400, "'stream_options.include_usage' must be true or false",
                            param="stream_options.include_usage")
    return _question(body), _options(body, service), stream, include_usage


def _usage(answer: AgentAnswer) -> dict[str, int]:
    return {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens}


def _agent_summary(answer: AgentAnswer, *, rounds: bool) -> dict[str, Any]:
    summary: dict[str, Any] = {"finish_reason": answer.finish_reason, "turns": len(answer.rounds),
                               "seconds": round(answer.seconds, 4)}
    if rounds:
        summary["rounds"] = [r.to_dict() for r in answer.rounds]
    return summary


def create_app(service: AgentService, *, model_id: str, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, api_key: Optional[str] = None,
               ping_s: float = DEFAULT_PING_S):
    """The FastAPI app serving `service` as model `model_id` (module docstring).

    max_in_flight: requests admitted at once (running or waiting for a batch), 429 beyond;
    max_body_bytes: 413 beyond; api_key: None serves without a key; ping_s: seconds between
    keep-alive comments of a stream."""
    # reason: `import mempo.serve` and `mempo --help` stay without fastapi and starlette
    from fastapi import FastAPI, Request
    from fastapi.responses import Response, StreamingResponse
    from starlette.exceptions import HTTPException

    for name, value in (("max_in_flight", max_in_flight), ("max_body_bytes", max_body_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if api_key is not None and not api_key.strip():
        raise ValueError("api_key must not be empty (None serves without a key)")
    created = int(time.time())
    state = {"in_flight": 0}

    def error_response(status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                       headers: Optional[dict[str, str]] = None) -> Response:
        return Response(openai_error_body(status, code, message, param), status_code=status,
                        media_type="application/json", headers=headers)

    def json_response(obj: Any) -> Response:
        return Response(json.dumps(obj, ensure_ascii=False).encode("utf-8"), media_type="application/json")

    app = FastAPI(title="mempo agent", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(BodyLimit, limit=max_body_bytes, error_body=_server_error_body)
    if api_key is not None:
        app.add_middleware(_ApiKey, key=api_key)  # added last: runs first, before the body is read

    @app.exception_handler(_RequestError)
    async def _request_error(request: Request, exc: _RequestError):
        return error_response(exc.status, exc.message, param=exc.param, code=exc.code, headers=exc.headers)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        codes = {404: "not_found", 405: "method_not_allowed"}
        return error_response(exc.status_code, str(exc.detail), code=codes.get(exc.status_code))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error",
                              headers=_NO_RETRY)

    # GET /health (no key): {"status": "ok", "model", "in_flight", "max_in_flight", "generation_batches",
    # "generated_rounds"} (the last two: backend calls so far and the rounds they generated; their
    # ratio is the mean batch size)
    @app.get("/health")
    def health():
        return json_response({"status": "ok", "model": model_id, "in_flight": state["in_flight"],
                              "max_in_flight": max_in_flight, "generation_batches": service.generation_batches,
                              "generated_rounds": service.generated_rounds})

    # GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}
    @app.get("/v1/models")
    def models():
        return json_response({"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                                          "owned_by": "mempo"}]})

    def admit(question: str, options: AgentOptions, on_round=None):
        """Submit the request when fewer than max_in_flight are in flight (429 otherwise); it counts
        until its episode ends (answered, failed, cancelled), whatever happens to the response."""
        if state["in_flight"] >= max_in_flight:
            raise _RequestError(429, f"{max_in_flight} requests are in flight (the server's bound); retry later",
                                code="rate_limit_exceeded", headers={"retry-after": "1"})
        try:
            ticket = service.submit(question, options, on_round=on_round)
        except ValueError as error:  # a question the episode layout cannot hold (options were checked)
            raise _RequestError(400, str(error), param="messages") from None
        state["in_flight"] += 1
        loop = asyncio.get_running_loop()

        def release() -> None:
            state["in_flight"] -= 1

        ticket.future.add_done_callback(lambda _: loop.call_soon_threadsafe(release))
        return ticket

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        question, options, stream, include_usage = _parse(await request.body(), model_id, service)
        # every check runs before a stream starts: after its 200 an error can only go in-band
        if stream:
            queue: asyncio.Queue = asyncio.Queue()
            loop = asyncio.get_running_loop()
            ticket = admit(question, options, on_round=lambda r: loop.call_soon_threadsafe(queue.put_nowait, r))
            ticket.future.add_done_callback(lambda _: loop.call_soon_threadsafe(queue.put_nowait, None))
            return StreamingResponse(_stream(ticket, queue, model_id, include_usage, ping_s),
                                     media_type="text/event-stream", headers={"cache-control": "no-cache"})
        ticket = admit(question, options)
        waiting = asyncio.wrap_future(ticket.future)
        while not waiting.done():
            await asyncio.wait({waiting}, timeout=0.5)
            if not waiting.done() and await request.is_disconnected():
                ticket.cancel()  # the client went away: the episode is dropped at its next round
                # its "cancelled" AgentError is expected: read it, so asyncio does not log it as never retrieved
                waiting.add_done_callback(lambda done: done.cancelled() or done.exception())
                return Response(status_code=499)
        try:
            answer = waiting.result()
        except DeadlineExceeded as error:
            raise _RequestError(504, str(error), code="deadline_exceeded", headers=_NO_RETRY) from None
        except AgentError as error:
            raise _RequestError(500, str(error), code="agent_error", headers=_NO_RETRY) from None
        return json_response({
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.answer or "", "refusal": None},
                         "finish_reason": completion_finish_reason(answer.finish_reason), "logprobs": None}],
            "usage": _usage(answer), "agent": _agent_summary(answer, rounds=True)})

    return app


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"


async def _stream(ticket, queue: asyncio.Queue, model_id: str, include_usage: bool, ping_s: float):
    """The server-sent events of one streamed request (module docstring); the episode is cancelled
    when the client goes away (the generator is closed then)."""
    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model_id}
    try:
        yield _event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                           "finish_reason": None, "logprobs": None}]})
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), ping_s)
            except asyncio.TimeoutError:
                yield b": ping\n\n"
                continue
            if item is None:
                break
            yield _event({**base, "choices": [], "agent_round": item.to_dict()})
        try:
            answer = ticket.result()
        except AgentError as error:
            code = "deadline_exceeded" if isinstance(error, DeadlineExceeded) else "agent_error"
            yield _event({"error": {"message": str(error), "type": _TYPES[504 if code == "deadline_exceeded" else 500],
                                    "param": None, "code": code}})
            yield b"data: [DONE]\n\n"
            return
        yield _event({**base, "choices": [{"index": 0, "delta": {"content": answer.answer or ""},
                                           "finish_reason": None, "logprobs": None}]})
        yield _event({**base, "choices": [{"index": 0, "delta": {},
                                           "finish_reason": completion_finish_reason(answer.finish_reason),
                                           "logprobs": None}],
                      "agent": _agent_summary(answer, rounds=False)})
        if include_usage:
            yield _event({**base, "choices": [], "usage": _usage(answer)})
        yield b"data: [DONE]\n\n"
    finally:
        if not ticket.done():
            ticket.cancel()


def _server_error_body(status: int, kind: str, message: str) -> bytes:
    return openai_error_body(status, kind, message)


class AgentServer(AppServer):
    """`create_app(service, ...)` served by uvicorn on a background thread (tests, benchmarks,
    notebooks): ``with AgentServer(service, model_id="m") as server: OpenAI(base_url=server.url + "/v1")``.
    `app_options`: `create_app`'s keywords and `mempo.env.server.uvicorn_server`'s connection bounds."""

    def __init__(self, service: AgentService, *, model_id: str, host: str = DEFAULT_HOST, port: int = 0,
                 log_level: str = "warning", **app_options: Any) -> None:
        server_options = {k: app_options.pop(k) for k in SERVER_OPTIONS if k in app_options}
        super().__init__(lambda: create_app(service, model_id=model_id, **app_options), host, port,
                         log_level=log_level, thread_name="mempo-agent", name="mempo serve",
                         error_body=_server_error_body, **server_options)


def serve_agent(service: AgentService, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, model_id: str,
                on_ready: Optional[Callable[[str], None]] = None, log_level: str = "warning",
                **app_options: Any) -> None:
    """Serve `service` in the calling thread until SIGINT/SIGTERM (`mempo.env.server.serve_app`);
    `app_options` as `AgentServer` takes them."""
    server_options = {k: app_options.pop(k) for k in SERVER_OPTIONS if k in app_options}
    serve_app(create_app(service, model_id=model_id, **app_options), host, port, on_ready=on_ready,
              log_level=log_level, what="the agent", name="mempo serve", error_body=_server_error_body,
              **server_options)
