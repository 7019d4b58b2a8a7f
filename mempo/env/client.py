"""`HTTPRetriever`: the `Retriever` interface over HTTP (a `mempo serve-retriever` server), stdlib only.

Requests (see `mempo.env.server` for the full shapes): ``POST {base_url}/retrieve`` with
``{"queries", "topk", "return_scores": true}``, ``POST {base_url}/access`` with
``{"doc_id", "page", "page_chars"}``, ``GET {base_url}/health``. Search also works against an original
Search-R1 ``retrieval_server.py`` (documents without a "title" field: the first line of "contents"
is taken as the title, outer double quotes removed).

Transport: stdlib `http.client` with one keep-alive connection per calling thread (a new TCP
connection per request would cost more than a BM25 search); a keep-alive connection the server has
closed while idle is reopened once without counting as an attempt. Proxy settings from the
environment (http_proxy, ...) are ignored: a retriever lives on this machine or the cluster network.

Failure policy (every error is a `RetrieverError` whose message names the URL):
- Each attempt waits at most `timeout` seconds (connect and each read).
- Connection errors (refused, reset, closed early), timeouts and 5xx answers are retried up to
  `retries` more times, sleeping ``backoff * 2**i`` seconds (capped at `max_backoff`) before retry
  i; when all attempts fail: `RetrieverUnavailableError` with the last cause. Worst case
  ``(retries + 1) * timeout + sum of the sleeps`` seconds.
- A 4xx answer is never retried: it becomes the error class the server names (``"error"`` field:
  invalid_request -> `InvalidRequestError`, document_not_found -> `DocumentNotFoundError`,
  page_out_of_range -> `PageOutOfRangeError`; without that field, by status for /access: 404 ->
  DocumentNotFoundError, 416 -> PageOutOfRangeError; any other 4xx -> InvalidRequestError), carrying
  the server's message.
- A 2xx answer that is not JSON or not the expected shape (or a 1xx/3xx answer) is garbage:
  `RetrieverUnavailableError`, not retried (the server answered; asking again gives the same).
"""
import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Any, Optional, Sequence

from mempo.env.retriever import (
    DEFAULT_PAGE_CHARS, DEFAULT_TOPK, DocumentNotFoundError, Hit, InvalidRequestError, Page, PageOutOfRangeError,
    Retriever, RetrieverUnavailableError, check_doc_id, check_page, check_page_chars, check_queries, check_topk,
    register_retriever,
)

__all__ = ["HTTPRetriever"]

_ERROR_KINDS = {
    "invalid_request": InvalidRequestError,
    "document_not_found": DocumentNotFoundError,
    "page_out_of_range": PageOutOfRangeError,
}
_ERROR_BY_STATUS = {404: DocumentNotFoundError, 416: PageOutOfRangeError}


class _Garbage(Exception):
    """The server answered 2xx with something that is not the expected JSON shape."""


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

    Thread-safe (one keep-alive connection per thread). `num_docs` and `page_chars` come from
    `/health`, fetched on first use.
    """

    name = "http"

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, timeout: float = 30.0, retries: int = 3,
                 backoff: float = 0.25, max_backoff: float = 8.0):
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"base_url must be an http(s) URL like http://127.0.0.1:8000, got {base_url!r}")
        if timeout <= 0 or retries < 0 or backoff < 0 or max_backoff < 0:
            raise ValueError("timeout must be > 0; retries, backoff and max_backoff must be >= 0")
        self.base_url = base_url.rstrip("/")
        self.timeout, self.retries, self.backoff, self.max_backoff = float(timeout), int(retries), backoff, max_backoff
        self._health: Optional[dict] = None
        self._scheme, self._host, self._port = parsed.scheme, parsed.hostname, parsed.port
        self._path_prefix = parsed.path.rstrip("/")
        self._local = threading.local()  # one keep-alive connection per thread

    def __repr__(self) -> str:
        return f"HTTPRetriever({self.base_url!r}, timeout={self.timeout}, retries={self.retries})"

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
        """One JSON request with the retry policy of the module docstring; returns the decoded body."""
        url = self.base_url + path
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        attempts = self.retries + 1
        last_cause = "no attempt made"
        attempt = 0
        while attempt < attempts:
            if attempt:
                time.sleep(min(self.backoff * 2 ** (attempt - 1), self.max_backoff))
            conn = self._connection()
            reused = conn.sock is not None
            try:
                conn.request(method, self._path_prefix + path, body=data, headers=headers)
                response = conn.getresponse()
                body = response.read()
                if response.will_close:
                    self._drop_connection()
            except (TimeoutError, socket.timeout):
                self._drop_connection()
                last_cause = f"no answer within {self.timeout:g} s"
                attempt += 1
                continue
            except (http.client.HTTPException, OSError) as exc:
                self._drop_connection()
                if reused:  # the server closed an idle keep-alive connection: redo on a fresh one, uncounted
                    continue
                if isinstance(exc, ConnectionRefusedError) or not isinstance(
                        exc, (ConnectionError, http.client.HTTPException)):
                    last_cause = f"cannot connect ({exc})"
                else:
                    last_cause = f"connection failed ({type(exc).__name__}: {exc})"
                attempt += 1
                continue
            status = response.status
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
                return json.loads(body)
            except ValueError:
                snippet = body[:80].decode("utf-8", "replace")
                raise RetrieverUnavailableError(f"retriever at {url} answered non-JSON: {snippet!r}") from None
        raise RetrieverUnavailableError(
            f"retriever at {url} unavailable after {attempts} attempt(s): {last_cause}")

    @staticmethod
    def _error_detail(raw: bytes, reason: str) -> tuple[Optional[str], str, Optional[int]]:
        """(error kind, message, num_pages) from an error answer's JSON body, else from its raw text."""
        try:
            body = json.loads(raw)
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

