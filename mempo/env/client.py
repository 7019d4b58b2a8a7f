"""`HTTPRetriever`: the `Retriever` interface over HTTP (a `mempo serve-retriever` server), stdlib only.

Requests (shapes: `mempo.env.server.create_app`): ``POST {base_url}/retrieve``, ``POST
{base_url}/access``, ``GET {base_url}/health``. Search also works against an original Search-R1
``retrieval_server.py`` (documents without a "title" field: the first line of "contents" is the
title, outer double quotes removed). Every error is a `RetrieverError` whose message names the URL.

Every body read is bounded: a `/health` answer by `MAX_HEALTH_BYTES` (1 MiB), a `/retrieve` or
`/access` answer by the client's `max_response_bytes` (default `DEFAULT_MAX_RESPONSE_BYTES`, 64 MiB:
the server's default cap of 10 M document characters as UTF-8 JSON with room to spare), an error
answer (4xx/5xx) by `MAX_ERROR_BYTES` (64 kB, the rest unread). A larger answer is refused as soon as
its Content-Length says so, or once that many bytes have arrived, with `RetrieverUnavailableError`
naming the URL and the bound (not retried: asking again gives the same); reading allocates at most
the bound plus one chunk of 1 MiB.
"""
import heapq
import http.client
import json
import math
import os
import socket
import threading
import time
import urllib.parse
from numbers import Real
from typing import Any, Optional, Sequence

from mempo.env.retriever import (
    DEFAULT_PAGE_CHARS, DEFAULT_TOPK, DocumentNotFoundError, Hit, InvalidRequestError, Page, PageOutOfRangeError,
    Retriever, RetrieverError, RetrieverUnavailableError, check_doc_id, check_page, check_page_chars, check_queries,
    check_topk, register_retriever,
)
from mempo.utils.jsonl import loads_bounded

__all__ = ["HTTPRetriever", "MAX_HEALTH_BYTES", "MAX_ERROR_BYTES", "DEFAULT_MAX_RESPONSE_BYTES"]

MAX_HEALTH_BYTES = 1 << 20
MAX_ERROR_BYTES = 64 << 10
DEFAULT_MAX_RESPONSE_BYTES = 64 << 20
_READ_CHUNK = 1 << 20

_ERROR_KINDS = {
    "invalid_request": InvalidRequestError,
    "document_not_found": DocumentNotFoundError,
    "page_out_of_range": PageOutOfRangeError,
}
_ERROR_BY_STATUS = {404: DocumentNotFoundError, 416: PageOutOfRangeError}


class _Garbage(Exception):
    """The server answered 2xx with something that is not the expected JSON shape."""


class _BodyTooLarge(Exception):
    """The answer's body is over the bound for its path (the message says how it showed)."""


def _read_bounded(response: http.client.HTTPResponse, limit: int, *, head_only: bool = False) -> tuple[bytes, bool]:
    """(the body, complete) read in chunks of at most 1 MiB: the whole body when it is at most
    `limit` bytes; else the first `limit` bytes and False, the rest left unread (the caller drops the
    connection). A declared Content-Length over `limit` reads nothing, (b"", False), unless
    `head_only` (an error answer: its first `limit` bytes are its message)."""
    declared = response.getheader("Content-Length")
    if not head_only and declared is not None and declared.strip().isdigit() and int(declared) > limit:
        return b"", False
    chunks, size = [], 0
    while size <= limit:
        chunk = response.read(min(_READ_CHUNK, limit + 1 - size))
        if not chunk:
            if response.length:  # read(amt) returns short at a closed socket, unlike read(): say so
                raise http.client.IncompleteRead(b"".join(chunks), response.length)
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)[:limit], False


class _Watchdog:
    """One daemon thread that cuts HTTP attempts off at their wall-clock deadline.

    `arm(sock, at)` registers a connected socket; once `time.monotonic()` passes `at`, the thread
    shuts it down (both directions), which makes a read or write blocked on it in another thread
    return at once. `disarm(token)` unregisters it and says whether it fired. The shutdown runs under
    the lock that `disarm` takes, and callers disarm before they close a socket, so a shutdown never
    reaches a closed socket's reused file descriptor.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []  # (deadline, token); entries of disarmed tokens are skipped
        self._armed: dict[int, tuple[float, socket.socket]] = {}
        self._fired: set[int] = set()
        self._next_token = 0
        self._thread: Optional[threading.Thread] = None

    def _reset_after_fork(self) -> None:  # the thread does not survive fork(); a child starts its own
        self.__init__()

    def arm(self, sock: socket.socket, at: float) -> int:
        with self._cond:
            token = self._next_token
            self._next_token += 1
            self._armed[token] = (at, sock)
            heapq.heappush(self._heap, (at, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mempo-http-deadline", daemon=True)
                self._thread.start()
            elif self._heap[0][1] == token:
                self._cond.notify()
            return token

    def disarm(self, token: int) -> bool:
        with self._cond:
            self._armed.pop(token, None)
            if len(self._heap) > 64 + 4 * len(self._armed):  # drop stale entries now and then
                self._heap = [(at, t) for t, (at, _) in self._armed.items()]
                heapq.heapify(self._heap)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                at, token = self._heap[0]
                wait = at - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                _, sock = self._armed.pop(token)
                self._fired.add(token)
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:  # already closed by the peer
                    pass


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WATCHDOG._reset_after_fork)


def _check_seconds(name: str, value: Any, *, positive: bool, allow_none: bool = False) -> Optional[float]:
    """`value` as a float: a finite real number, > 0 (`positive`) or >= 0; else ValueError naming `name`."""
    if value is None and allow_none:
        return None
    bound = "> 0" if positive else ">= 0"
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)) \
            or (float(value) <= 0 if positive else float(value) < 0):
        raise ValueError(f"{name} must be a finite number of seconds {bound}"
                         f"{' or None' if allow_none else ''}, got {value!r}")
    return float(value)


def _split_contents(document: dict) -> tuple[str, str]:
    """(title, text) of a /retrieve document: ours carry "title"; Search-R1's put it on line 1."""
    contents = document["contents"]
    if not isinstance(contents, str):
        raise _Garbage("document 'contents' is not a string")
    title = document.get("title")
    if title is not None:
        if not isinstance(title, str):
            raise _Garbage("document 'title' is not a string")
        prefix = title + "\n"
        return title, contents[len(prefix):] if contents.startswith(prefix) else contents
    first, _, rest = contents.partition("\n")
    first = first.strip()
    if len(first) >= 2 and first[0] == first[-1] == '"':
        first = first[1:-1]
    return first, rest


@register_retriever("http")
class HTTPRetriever(Retriever):
    """A remote retriever speaking the Search-R1 `/retrieve` API plus `/access` and `/health`.

    Thread-safe: stdlib `http.client` with one keep-alive connection per calling thread (a new TCP
    connection per request would cost more than a BM25 search). Proxy settings from the environment
    are ignored: a retriever lives on this machine or the cluster network. `num_docs` and
    `page_chars` come from `/health`, fetched on first use.

    timeout: seconds per attempt (connect, send, status line, headers and the whole body).
    deadline: seconds per call, every attempt and backoff sleep included (None: the worst case
    ``(retries + 1) * timeout`` plus the sleeps), so a call returns or raises within about
    `deadline` seconds whatever the server does. retries / backoff / max_backoff: the retry policy
    (`_request`). max_response_bytes: the most bytes a `/retrieve` or `/access` answer may hold
    (a larger answer is refused with `RetrieverUnavailableError` naming the bound, not retried).
    """

    name = "http"

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, timeout: float = 30.0, retries: int = 3,
                 backoff: float = 0.25, max_backoff: float = 8.0, deadline: Optional[float] = None,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES):
        parsed = urllib.parse.urlsplit(base_url) if isinstance(base_url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"base_url must be an http(s) URL like http://127.0.0.1:8000, got {base_url!r}")
        timeout = _check_seconds("timeout", timeout, positive=True)
        backoff = _check_seconds("backoff", backoff, positive=False)
        max_backoff = _check_seconds("max_backoff", max_backoff, positive=False)
        deadline = _check_seconds("deadline", deadline, positive=True, allow_none=True)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
        if isinstance(max_response_bytes, bool) or not isinstance(max_response_bytes, int) or max_response_bytes < 1:
            raise ValueError(f"max_response_bytes must be an integer >= 1, got {max_response_bytes!r}")
        self.max_response_bytes = max_response_bytes
        self.base_url = base_url.rstrip("/")
        self.timeout, self.retries, self.backoff, self.max_backoff = timeout, retries, backoff, max_backoff
        sleeps = sum(min(backoff * 2 ** i, max_backoff) for i in range(retries))
        self.deadline = (retries + 1) * timeout + sleeps if deadline is None else deadline
        self._health: Optional[dict] = None
        self._scheme, self._host, self._port = parsed.scheme, parsed.hostname, parsed.port
        self._path_prefix = parsed.path.rstrip("/")
        self._local = threading.local()  # one keep-alive connection per thread

    def __repr__(self) -> str:
        return (f"HTTPRetriever({self.base_url!r}, timeout={self.timeout:g}, retries={self.retries}, "
                f"deadline={self.deadline:g})")

    def close(self) -> None:
        """Close the calling thread's keep-alive connection (others close with their threads)."""
        self._drop_connection()

    # -- transport -----------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            conn = self._local.conn = cls(self._host, self._port, timeout=self.timeout)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _request(self, method: str, path: str, payload: Optional[dict] = None) -> Any:
        """One JSON request; returns the decoded body.

        Size limits: the body read is bounded: at most `MAX_HEALTH_BYTES` for
        /health, `max_response_bytes` for other paths, `MAX_ERROR_BYTES` of an error answer.

        Time limits (wall clock, `time.monotonic`): an attempt gets ``min(timeout, time left)``; a
        watchdog thread shuts its socket down when its time is up, so a server that trickles bytes
        cannot hold a call (a per-read socket timeout alone would restart with every byte). Not
        covered: the host-name lookup (use an IP address or localhost) and, for https, the TLS
        handshake, bounded per read only. No retry starts once the deadline has passed or would
        pass during its backoff sleep.

        Failures:
        1. connection errors (refused, reset, closed early), timeouts and 5xx answers are retried up
           to `retries` more times, sleeping ``backoff * 2**i`` s (capped at `max_backoff`) before
           retry i; then `RetrieverUnavailableError` with the last cause. A keep-alive connection the
           server closed while idle is reopened once without counting as an attempt;
        2. a 4xx answer is never retried: it becomes the error class the server names (``"error"``:
           invalid_request, document_not_found, page_out_of_range; without it, for /access: 404 ->
           DocumentNotFoundError, 416 -> PageOutOfRangeError; any other 4xx -> InvalidRequestError),
           carrying the server's message;
        3. a 2xx answer that is not JSON (or a 1xx/3xx answer) is garbage: `RetrieverUnavailableError`,
           not retried (asking again gives the same).
        """
        url = self.base_url + path
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        started = time.monotonic()
        call_deadline = started + self.deadline
        attempts = self.retries + 1
        last_cause = "no attempt made"
        attempt = 0
        while attempt < attempts:
            if attempt:
                pause = min(self.backoff * 2 ** (attempt - 1), self.max_backoff)
                if time.monotonic() + pause >= call_deadline:
                    break
                time.sleep(pause)
            budget = min(self.timeout, call_deadline - time.monotonic())
            if budget <= 0:
                break
            attempt_end = time.monotonic() + budget
            conn = self._connection()
            reused = conn.sock is not None
            token = None
            fired = False
            try:
                try:
                    if conn.sock is None:
                        conn.timeout = budget  # bounds the connect
                        conn.connect()
                    conn.sock.settimeout(budget)
                    token = _WATCHDOG.arm(conn.sock, attempt_end)
                    conn.request(method, self._path_prefix + path, body=data, headers=headers)
                    response = conn.getresponse()
                    limit = MAX_ERROR_BYTES if response.status >= 400 else (
                        MAX_HEALTH_BYTES if path == "/health" else self.max_response_bytes)
                    body, complete = _read_bounded(response, limit, head_only=response.status >= 400)
                finally:
                    if token is not None:
                        fired = _WATCHDOG.disarm(token)  # before any close: see _Watchdog
            except (http.client.HTTPException, OSError) as exc:
                self._drop_connection()
                if fired or isinstance(exc, (TimeoutError, socket.timeout)):
                    last_cause = f"no answer within {self.timeout:g} s" if budget >= self.timeout else (
                        f"no answer within {budget:.2g} s (the rest of the {self.deadline:g} s deadline)")
                    attempt += 1
                    continue
                if reused:  # the server closed an idle keep-alive connection: redo on a fresh one, uncounted
                    continue
                if isinstance(exc, ConnectionRefusedError) or not isinstance(
                        exc, (ConnectionError, http.client.HTTPException)):
                    last_cause = f"cannot connect ({exc})"
                else:
                    last_cause = f"connection failed ({type(exc).__name__}: {exc})"
                attempt += 1
                continue
            if not complete:  # a body left unread: the response holds the socket open until closed
                response.close()
            if fired or response.will_close or not complete:  # a fired watchdog shut the socket down, answer
                self._drop_connection()                           # complete or not; or a body left unread
            status = response.status
            if not complete and status < 400:
                what = "its Content-Length" if not body else f"more than {limit} bytes arrived"
                raise RetrieverUnavailableError(
                    f"retriever at {url} answered a body over the client's limit of {limit} bytes for {path} "
                    f"({what}; {'MAX_HEALTH_BYTES' if path == '/health' else 'max_response_bytes'})")
            if status >= 500:
                last_cause = f"HTTP {status}: {self._error_detail(body, response.reason)[1][:200]}"
                attempt += 1
                continue
            if status >= 400:
                kind, message, num_pages = self._error_detail(body, response.reason)
                error_class = _ERROR_KINDS.get(kind) or (
                    _ERROR_BY_STATUS.get(status, InvalidRequestError) if path == "/access" else InvalidRequestError)
                text = f"{message} (HTTP {status} from {url})"
                if error_class is PageOutOfRangeError:
                    raise PageOutOfRangeError(text, num_pages=num_pages)
                raise error_class(text)
            if status >= 300 or status < 200:
                raise RetrieverUnavailableError(f"retriever at {url} answered HTTP {status} {response.reason}")
            try:
                return loads_bounded(body, url)  # nesting bounded: a deep body is an error, not a RecursionError
            except ValueError:
                snippet = body[:80].decode("utf-8", "replace")
                raise RetrieverUnavailableError(f"retriever at {url} answered non-JSON: {snippet!r}") from None
        raise RetrieverUnavailableError(
            f"retriever at {url} unavailable after {attempt} attempt(s) in {time.monotonic() - started:.1f} s "
            f"(deadline {self.deadline:g} s): {last_cause}")

    @staticmethod
    def _error_detail(raw: bytes, reason: str) -> tuple[Optional[str], str, Optional[int]]:
        """(error kind, message, num_pages) from an error answer's JSON body, else from its raw text."""
        try:
            body = loads_bounded(raw, "error answer")
        except ValueError:
            text = raw[:200].decode("utf-8", "replace").strip()
            return None, text or (reason or "no message"), None
        if isinstance(body, dict):
            kind = body.get("error") if isinstance(body.get("error"), str) else None
            num_pages = body.get("num_pages") if isinstance(body.get("num_pages"), int) else None
            detail = body.get("detail")
            if isinstance(detail, str):
                return kind, detail, num_pages
            if detail is not None:
                return kind, json.dumps(detail)[:500], num_pages
        return None, json.dumps(body)[:500], None

    def _garbage(self, path: str, why: str) -> RetrieverUnavailableError:
        return RetrieverUnavailableError(f"retriever at {self.base_url + path} answered an unexpected shape: {why}")

    # -- the Retriever interface ---------------------------------------------------------------

    def health(self) -> dict:
        """The server's `/health` answer: status, retriever, num_docs, limits."""
        body = self._request("GET", "/health")
        if not isinstance(body, dict) or not isinstance(body.get("num_docs"), int):
            raise self._garbage("/health", "expected an object with an integer 'num_docs'")
        self._health = body
        return body

    def check_health(self) -> Optional[dict]:
        """Fail fast when the server cannot serve: call it once before work that needs the retriever.

        Asks `/health` (with the client's retries and deadline) and returns its answer. A server
        without `/health` (HTTP 404: an original Search-R1 ``retrieval_server.py``) passes when one
        probe search answers in the expected shape; then the result is None. Raises
        `RetrieverUnavailableError` naming the URL when the server is down, slow, answers garbage
        or an error, or serves no documents.
        """
        try:
            try:
                health = self.health()
            except InvalidRequestError as exc:
                if "HTTP 404" not in str(exc):
                    raise
                self.search(["health check"], 1)  # Search-R1: no /health, but /retrieve must answer
                return None
        except RetrieverError as exc:
            raise RetrieverUnavailableError(f"retriever at {self.base_url} failed its health check: {exc}") from None
        if health["num_docs"] < 1:
            raise RetrieverUnavailableError(
                f"retriever at {self.base_url} failed its health check: it serves no documents")
        return health

    def wait_until_ready(self, timeout: float = 60.0, interval: float = 0.05) -> dict:
        """Poll `/health` until it answers (or `timeout` seconds pass: `RetrieverUnavailableError`)."""
        deadline = time.monotonic() + timeout
        probe = HTTPRetriever(self.base_url, timeout=min(self.timeout, max(interval, 1.0)), retries=0)
        while True:
            try:
                self._health = probe.health()
                return self._health
            except RetrieverUnavailableError as exc:
                if time.monotonic() >= deadline:
                    raise RetrieverUnavailableError(
                        f"retriever at {self.base_url} not ready after {timeout:g} s: {exc}") from None
                time.sleep(interval)

    @property
    def num_docs(self) -> int:
        return (self._health or self.health())["num_docs"]

    @property
    def page_chars(self) -> int:  # type: ignore[override]
        return (self._health or self.health()).get("page_chars", DEFAULT_PAGE_CHARS)

    def search(self, queries: Sequence[str], topk: int = DEFAULT_TOPK) -> list[list[Hit]]:
        queries = check_queries(queries)
        topk = check_topk(topk)
        body = self._request("POST", "/retrieve", {"queries": queries, "topk": topk, "return_scores": True})
        try:
            result = body["result"]
            if not isinstance(result, list) or len(result) != len(queries):
                raise _Garbage(f"'result' must be a list of {len(queries)} lists")
            hits = []
            for ranked in result:
                if not isinstance(ranked, list):
                    raise _Garbage("each 'result' entry must be a list")
                query_hits = []
                for item in ranked:
                    document, score = item["document"], item["score"]
                    doc_id = document["id"]
                    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
                        raise _Garbage("document 'id' must be a string")
                    if not isinstance(score, (int, float)) or isinstance(score, bool):
                        raise _Garbage("'score' must be a number")
                    title, text = _split_contents(document)
                    query_hits.append(Hit(str(doc_id), title, text, float(score)))
                hits.append(query_hits)
        except _Garbage as exc:
            raise self._garbage("/retrieve", str(exc)) from None
        except (KeyError, TypeError) as exc:
            raise self._garbage("/retrieve", f"missing or mistyped field ({type(exc).__name__}: {exc})") from None
        return hits

    def access(self, doc_id: str, page: int = 0, page_chars: Optional[int] = None) -> Page:
        payload = {"doc_id": check_doc_id(doc_id), "page": check_page(page)}
        if page_chars is not None:
            payload["page_chars"] = check_page_chars(page_chars)
        body = self._request("POST", "/access", payload)
        try:
            page_obj = Page(body["doc_id"], body["title"], body["page"], body["num_pages"], body["text"])
        except (KeyError, TypeError) as exc:
            raise self._garbage("/access", f"missing field ({type(exc).__name__}: {exc})") from None
        if not (isinstance(page_obj.doc_id, str) and isinstance(page_obj.title, str) and isinstance(page_obj.text, str)
                and isinstance(page_obj.page, int) and isinstance(page_obj.num_pages, int)):
            raise self._garbage("/access", "mistyped field")
        return page_obj

