"""The retrieval server (real uvicorn on a free loopback port) and the HTTP client's failure modes.

Servers started here: `RetrieverServer` threads (module fixture and a few small ones), one
`python -m mempo.apps.cli serve-retriever` subprocess, and stdlib `http.server` stand-ins (garbage,
5xx, slow, Search-R1). Every one is stopped before its test ends; all bind 127.0.0.1.
"""
import contextlib
import dataclasses
import http.client
import http.server
import json
import os
import queue
import signal
import socket
import subprocess
import tempfile
import sys
import threading
import time

import pytest

from mempo.apps.cli import main as cli_main
from mempo.env.client import HTTPRetriever
from mempo.env.corpus import write_corpus
from mempo.env.retriever import (
    DocumentNotFoundError, InvalidRequestError, PageOutOfRangeError, RetrieverError,
    RetrieverUnavailableError,
)
from mempo.env.server import RetrieverServer, create_app, is_loopback
from mempo.env.tools import SearchTool




@pytest.fixture(scope="module")
def server(bm25):
    with RetrieverServer(bm25, topk_max=50, max_queries=8, max_query_chars=100) as running:
        HTTPRetriever(running.url).wait_until_ready(timeout=10)
        yield running
    assert running._thread is None  # stopped and joined


def post(url: str, path: str, body: bytes, content_type: str = "application/json"):
    """Raw POST on a fresh connection: (status, decoded JSON or raw bytes)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type})
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ------------------------------------------------------------------------------------------------
# the API
# ------------------------------------------------------------------------------------------------

def test_health(server, corpus):
    status, body = post(server.url, "/retrieve", b'{"queries": ["zebulon1"]}')
    assert status == 200
    health = HTTPRetriever(server.url).health()
    assert health == {"status": "ok", "retriever": "bm25", "num_docs": len(corpus), "default_topk": 5,
                      "topk_max": 50, "max_queries": 8, "max_query_chars": 100, "page_chars": 25_000,
                      "max_doc_chars": 25_000, "max_response_chars": 10_000_000}
    assert server.url.startswith("http://127.0.0.1:")


def test_retrieve_speaks_search_r1(server, bm25):
    status, body = post(server.url, "/retrieve",
                        json.dumps({"queries": ["zebulon2", "river stone"], "topk": 3, "return_scores": True}).encode())
    assert status == 200 and list(body) == ["result"] and len(body["result"]) == 2
    first = body["result"][0][0]
    assert set(first) == {"document", "score"} and set(first["document"]) == {"id", "title", "contents"}
    assert first["document"]["id"] == "needle-2"
    hit = bm25.search(["zebulon2"], 3)[0][0]
    assert first["document"]["contents"] == hit.title + "\n" + hit.text
    assert first["score"] == pytest.approx(hit.score)
    assert len(body["result"][1]) == 3
    # Search-R1 client parsing: the first line of "contents" is the title
    assert first["document"]["contents"].split("\n")[0] == "Needle 2"
    # without scores (and without topk: the default 5), each entry is the bare document
    status, body = post(server.url, "/retrieve", b'{"queries": ["river"]}')
    assert status == 200 and len(body["result"][0]) == 5 and set(body["result"][0][0]) == {"id", "title", "contents"}


@pytest.mark.parametrize("body, fragment", [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe\x00", "not valid JSON"),
    (b"[]", "body"),
    (b'"queries"', "body"),
    (b"{}", "queries: Field required"),
    (b'{"queries": "river"}', "queries"),
    (b'{"queries": [1]}', "queries.0"),
    (b'{"queries": []}', "queries is empty"),
    (b'{"queries": ["   "]}', "queries[0] is blank"),
    (b'{"queries": ["' + b"x" * 101 + b'"]}', "too long"),
    (json.dumps({"queries": ["q"] * 9}).encode(), "too many queries"),
    (b'{"queries": ["river"], "topk": 0}', "topk must be >= 1"),
    (b'{"queries": ["river"], "topk": -3}', "topk must be >= 1"),
    (b'{"queries": ["river"], "topk": 51}', "over the limit 50"),
    (b'{"queries": ["river"], "topk": 100000000000000000000000000}', "over the limit"),
    (b'{"queries": ["river"], "topk": "5"}', "topk"),
    (b'{"queries": ["river"], "topk": 5.5}', "topk"),
    (b'{"queries": ["river"], "topk": true}', "topk"),
    (b'{"queries": ["river"], "return_scores": "yes"}', "return_scores"),
    (b'{"queries": ["river"], "top_k": 5}', "top_k: Extra inputs are not permitted"),
])
def test_malformed_retrieve_requests_are_4xx(server, body, fragment):
    status, answer = post(server.url, "/retrieve", body)
    assert status in (400, 422), answer
    assert answer["error"] == "invalid_request" and fragment in answer["detail"]


def test_access_endpoint(server, bm25):
    status, body = post(server.url, "/access", b'{"doc_id": "long-0", "page": 1}')
    assert status == 200
    page = bm25.access("long-0", 1)
    assert body == {"doc_id": "long-0", "title": page.title, "page": 1, "num_pages": 3, "text": page.text}
    status, body = post(server.url, "/access", b'{"doc_id": "long-0", "page_chars": 1000}')
    assert status == 200 and body["num_pages"] == 60 and len(body["text"]) == 1000
    cases = [
        (b'{"doc_id": "absent"}', 404, "document_not_found", "unknown document id 'absent'"),
        (b'{"doc_id": "long-0", "page": 3}', 416, "page_out_of_range", "numbered 0 to 2"),
        (b'{"doc_id": "long-0", "page": -1}', 422, "invalid_request", "page must be >= 0"),
        (b'{"doc_id": "long-0", "page": "1"}', 422, "invalid_request", "page"),
        (b'{"doc_id": "long-0", "page_chars": 0}', 422, "invalid_request", "page_chars"),
        (b'{"doc_id": "long-0", "page_chars": 10000000}', 422, "invalid_request", "over the limit"),
        (b'{"doc_id": ""}', 422, "invalid_request", "doc_id is empty"),
        (b'{"page": 0}', 422, "invalid_request", "doc_id: Field required"),
        (b"nope", 422, "invalid_request", "not valid JSON"),
    ]
    for request, status_expected, kind, fragment in cases:
        status, body = post(server.url, "/access", request)
        assert (status, body["error"]) == (status_expected, kind), (request, body)
        assert fragment in body["detail"], (request, body)
    _, body = post(server.url, "/access", b'{"doc_id": "long-0", "page": 3}')
    assert body["num_pages"] == 3


def test_body_limit_and_unknown_routes(bm25):
    with RetrieverServer(bm25, max_body_bytes=1000) as small:
        status, body = post(small.url, "/retrieve", json.dumps({"queries": ["x" * 2000]}).encode())
        assert status == 413 and body["error"] == "request_too_large"
        status, body = post(small.url, "/nothing", b"{}")
        assert status == 404 and body["error"] == "not_found"


@pytest.fixture(scope="module")
def big_doc_retriever():
    """Ten documents sharing the word "bigword", each 2 MB of text (a title of 300 characters)."""
    from mempo.env.corpus import Document
    from mempo.env.bm25 import BM25Retriever

    docs = [Document(f"big-{i}", f"Big {i} " + "t" * 294, "bigword " + "x" * 2_000_000) for i in range(10)]
    docs.append(Document("small", "Small", "bigword small"))
    retriever = BM25Retriever.build(docs)
    yield retriever
    retriever.close()


def test_response_bounds_per_document_and_per_response(big_doc_retriever):
    """Issue 10, case 6: one big document and many queries no longer make an unbounded answer."""
    with RetrieverServer(big_doc_retriever, max_doc_chars=1000, max_response_chars=20_000) as small:
        # per document: title and text each cut to max_doc_chars, "contents" built from the cut parts
        status, body = post(small.url, "/retrieve", json.dumps({"queries": ["bigword"], "topk": 3}).encode())
        assert status == 200
        for document in body["result"][0]:
            if document["id"].startswith("big-"):
                assert len(document["title"]) == 300 and document["contents"].startswith(document["title"] + "\n")
                assert len(document["contents"]) == 300 + 1 + 1000
        # per response: 10 queries at top-3 would hold ~ 30 x 1600 characters > 20,000: a clear 413
        status, body = post(small.url, "/retrieve", json.dumps({"queries": ["bigword"] * 8, "topk": 3}).encode())
        assert status == 413 and body["error"] == "response_too_large", body
        assert "over the limit of 20000 (max_response_chars)" in body["detail"] and "fewer queries" in body["detail"]
        # /access pages are bounded the same way (page_chars is already capped by max_page_chars)
        status, body = post(small.url, "/access", b'{"doc_id": "big-0", "page_chars": 50000}')
        assert status == 413 and body["error"] == "response_too_large" and "smaller page_chars" in body["detail"]
        status, body = post(small.url, "/access", b'{"doc_id": "big-0", "page_chars": 5000}')
        assert status == 200 and len(body["text"]) == 5000 and len(body["title"]) == 300
        # the client does not retry a 413 and says what the server said
        client = HTTPRetriever(small.url, retries=3, backoff=0.01)
        with pytest.raises(InvalidRequestError, match="max_response_chars.*HTTP 413"):
            client.search(["bigword"] * 8, 3)
        hits = client.search(["bigword"], 3)[0]
        assert [len(h.text) for h in hits if h.doc_id.startswith("big-")] == [1000] * 2
    with RetrieverServer(big_doc_retriever) as default:  # defaults: 25,000 per document
        status, body = post(default.url, "/retrieve", json.dumps({"queries": ["bigword"] * 10, "topk": 1}).encode())
        assert status == 200 and len(body["result"]) == 10
        assert all(len(r[0]["contents"]) <= 2 * 25_000 + 1 for r in body["result"])


class _CountingBM25:
    """Wraps a BM25 retriever's document reads to count the characters of every Hit built (what a
    request made the server allocate), whichever method builds them (`search`, or `hit`)."""

    def __init__(self, retriever, monkeypatch):
        self.built = 0
        search, hit = retriever.search, getattr(retriever, "hit", None)

        def counted_search(queries, topk=5):
            hits = search(queries, topk)
            self.built += sum(len(h.title) + len(h.text) for ranked in hits for h in ranked)
            return hits

        def counted_hit(row, score):
            built = hit(row, score)
            self.built += len(built.title) + len(built.text)
            return built

        monkeypatch.setattr(retriever, "search", counted_search)
        if hit is not None:
            monkeypatch.setattr(retriever, "hit", counted_hit)


def test_response_bound_is_checked_before_any_document_is_built(big_doc_retriever, monkeypatch):
    """Issue 21, case 3, bound by work: a request over max_response_chars used to build every hit
    (here 8 queries x top-3, two of them 2 MB documents: ~32 M characters) before its 413; now the size comes
    from the index's document lengths and a refused request builds no document at all. An accepted
    request builds each hit's document once (the answer holds the cut copies)."""
    counting = _CountingBM25(big_doc_retriever, monkeypatch)
    with RetrieverServer(big_doc_retriever, max_doc_chars=1000, max_response_chars=20_000) as small:
        status, body = post(small.url, "/retrieve", json.dumps({"queries": ["bigword"] * 8, "topk": 3}).encode())
        assert status == 413 and body["error"] == "response_too_large"
        assert "would hold 25784 characters" in body["detail"]  # 8 x ("small": 2 x 5 + 13, two big: 2 x 300 + 1000)
        assert counting.built == 0
        status, body = post(small.url, "/retrieve", json.dumps({"queries": ["bigword"] * 2, "topk": 2}).encode())
        assert status == 200 and len(body["result"]) == 2
        assert counting.built == 2 * (5 + 13 + 300 + 2_000_008)  # per query "small" and one big document, once


def test_a_damaged_index_is_refused_before_serving(tmp_path, corpus, capsys):
    from mempo.env.bm25 import BM25Retriever

    index_dir = BM25Retriever.build(corpus).save(tmp_path / "index")
    (index_dir / "bm25s" / "vocab.index.json").write_bytes(b"")
    assert cli_main(["serve-retriever", "--index-dir", str(index_dir), "--port", "0"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mempo serve-retriever: {index_dir / 'bm25s' / 'vocab.index.json'}")


@pytest.mark.parametrize("sent", [b"", b"GET /health HTTP/1.1\r\nHo", b"POST /retrieve HTTP/1.1\r\nHost: x\r\n"
                                              b"Content-Length: 100\r\n\r\n{\"queries\""],
                         ids=["silent", "half-headers", "half-body"])
def test_slow_and_silent_connections_are_closed_after_the_request_timeout(bm25, sent):
    """Issue 21, case 3: a connection that never sends, or stops mid-request, used to be kept open
    for ever (uvicorn times out idle keep-alive connections only); now it is closed once
    request_timeout has passed, and a connection that sends its request in time is answered."""
    with RetrieverServer(bm25, request_timeout=0.5) as small:
        port = int(small.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
            slow.sendall(sent)
            started = time.monotonic()
            assert slow.recv(1024) == b""  # closed by the server (a timeout here raises socket.timeout)
            assert 0.3 < time.monotonic() - started < 4
        assert HTTPRetriever(small.url, retries=0).health()["num_docs"] == bm25.num_docs


def test_connection_bounds_are_validated(bm25):
    from mempo.env.server import max_connections_for

    for options, fragment in [({"request_timeout": 0}, "request_timeout must be"),
                              ({"keep_alive": 0}, "keep_alive must be"),
                              ({"max_connections": True}, "max_connections")]:
        with pytest.raises(ValueError, match=fragment):
            RetrieverServer(bm25, **options).start()
    assert 1 <= max_connections_for(10**9) < 10**9 or max_connections_for(10**9) == 10**9
    assert max_connections_for(5) == 5


_FD_PROBE = """
import socket, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(count):
    try:
        held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
    except OSError:
        break

def health():
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as probe:
            probe.sendall(b"GET /health HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
            return probe.recv(64).split(b"\\r\\n")[0].decode()
    except OSError as error:
        return type(error).__name__

time.sleep(0.5)
busy = 0
for held_one in held:  # connections past the limit were answered 503 and closed at once
    held_one.settimeout(0.01)
    try:
        busy += held_one.recv(64).startswith(b"HTTP/1.1 503")
    except OSError:
        pass
print(len(held), busy, flush=True)
print(health(), flush=True)  # the idle connections hold the descriptors: an answer, not a hang
time.sleep(3)                # past the request timeout: the idle connections are closed
print(health(), flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs bash ulimit -n")
def test_out_of_file_descriptors_degrades_to_503_and_logs_one_line(tmp_path):
    """Issue 21, case 3: with `ulimit -n 64`, 100 idle connections used to make /health hang and
    fill stderr with thousands of "Too many open files" tracebacks; now a connection past the limit
    is answered 503 and closed, /health answers within seconds (503 or, once the idle connections
    have timed out, 200), and the exhaustion is logged in at most one line per interval."""
    from mempo.env.corpus import Document

    corpus = tmp_path / "corpus.jsonl"
    write_corpus(corpus, [Document(f"d{i}", f"T{i}", f"river word {i}") for i in range(20)])
    port = closed_port()
    command = (f"ulimit -n 64; exec {sys.executable} -m mempo.apps.cli serve-retriever --corpus {corpus} "
               f"--port {port} --request-timeout 1.5")
    server = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    try:
        assert "mempo-retriever ready" in server.stdout.readline()
        probe = subprocess.run([sys.executable, "-c", _FD_PROBE, str(port), "100"], capture_output=True, text=True,
                               timeout=60)
        counts, during, after = probe.stdout.splitlines()
        held, busy = map(int, counts.split())
        # limit 32 at 64 descriptors: the connections accepted past it got 503; those a burst left in the
        # kernel's queue once the descriptors ran out wait there until the idle ones time out
        assert held == 100 and busy >= 20, probe
        assert during in ("HTTP/1.1 503 Service Unavailable", "HTTP/1.1 200 OK") and after == "HTTP/1.1 200 OK", probe
    finally:
        server.terminate()
        try:
            _, err = server.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            _, err = server.communicate()
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) <= 4, err[-2000:]
    assert all(line.startswith(("mempo: built", "mempo serve-retriever: out of file descriptors")) for line in lines)


def test_app_rejects_bad_limits(bm25):
    with pytest.raises(ValueError):
        create_app(bm25, default_topk=10, topk_max=5)
    for name in ("max_doc_chars", "max_response_chars", "max_queries"):
        with pytest.raises(ValueError, match=f"{name} must be an integer >= 1"):
            create_app(bm25, **{name: 0})
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")


# ------------------------------------------------------------------------------------------------
# the client against the real server
# ------------------------------------------------------------------------------------------------

def test_http_retriever_matches_in_process(server, bm25, corpus):
    client = HTTPRetriever(server.url, timeout=5, retries=0)
    queries = ["zebulon5", "river stone market", "Long start", "nomatchatall"]
    # the same hits; the server cuts each text to max_doc_chars (25,000) and /access reads the rest
    cut = [[dataclasses.replace(h, text=h.text[:25_000]) for h in hits] for hits in bm25.search(queries, 7)]
    assert client.search(queries, 7) == cut
    assert any(len(h.text) > 25_000 for hits in bm25.search(queries, 7) for h in hits)
    assert client.access("long-2", 2) == bm25.access("long-2", 2)
    assert client.access("needle-1", 0, page_chars=7) == bm25.access("needle-1", 0, page_chars=7)
    assert client.num_docs == len(corpus) and client.page_chars == 25_000


def test_http_retriever_maps_4xx_without_retrying(server):
    client = HTTPRetriever(server.url, timeout=5, retries=3, backoff=10.0)  # a retry would take >= 10 s
    started = time.monotonic()
    with pytest.raises(DocumentNotFoundError, match="unknown document id 'absent'.*HTTP 404 from http://127.0.0.1"):
        client.access("absent")
    with pytest.raises(PageOutOfRangeError) as info:
        client.access("long-0", 9)
    assert info.value.num_pages == 3
    with pytest.raises(InvalidRequestError, match="too long"):
        client.search(["x" * 101])
    with pytest.raises(InvalidRequestError, match="over the limit 50"):
        client.search(["river"], topk=51)
    with pytest.raises(InvalidRequestError):  # checked locally, never sent
        client.search([])
    assert time.monotonic() - started < 5.0  # no retry: one would sleep 10 s


# ------------------------------------------------------------------------------------------------
# client failure modes
# ------------------------------------------------------------------------------------------------

def test_server_down_names_the_url_after_bounded_retries():
    url = f"http://127.0.0.1:{closed_port()}"
    client = HTTPRetriever(url, timeout=0.5, retries=2, backoff=0.01)
    started = time.monotonic()
    with pytest.raises(RetrieverUnavailableError) as info:
        client.search(["river"])
    message = str(info.value)
    assert f"{url}/retrieve" in message and "after 3 attempt(s)" in message and "cannot connect" in message
    assert time.monotonic() - started < 5.0  # refused at once, 3 times: bounded, with room for a loaded machine
    with pytest.raises(RetrieverError, match="not ready after 0.2 s"):
        HTTPRetriever(url).wait_until_ready(timeout=0.2, interval=0.05)


class _StandIn(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's (status, body, delay) and counts requests."""

    protocol_version = "HTTP/1.1"  # keep-alive unless the answer says otherwise

    def do_POST(self):
        self.server.hits += 1
        status, body, delay = self.server.answer
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        if delay:
            time.sleep(delay)
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if not self.server.drop_idle:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        # drop_idle: promise keep-alive but close anyway, like a server whose idle timeout expired
        self.close_connection = True

    do_GET = do_POST

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def stand_in(status: int, body: bytes, delay: float = 0.0, drop_idle: bool = False):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    httpd.daemon_threads = True
    httpd.answer, httpd.hits, httpd.drop_idle = (status, body, delay), 0, drop_idle
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.mark.parametrize("body, fragment", [
    (b"<html>surprise</html>", "answered non-JSON"),
    (b'{"result": "nope"}', "unexpected shape"),
    (b'{"result": [[{"document": {"id": "a"}, "score": 1}]]}', "unexpected shape"),
    (b'{"result": [[{"document": {"id": "a", "contents": "t\\nx"}, "score": "high"}]]}', "unexpected shape"),
    (b'{"result": []}', "unexpected shape"),
    (b"[1, 2]", "unexpected shape"),
])
def test_garbage_answers_raise_without_retry(body, fragment):
    with stand_in(200, body) as (httpd, url):
        client = HTTPRetriever(url, timeout=2, retries=3, backoff=0.01)
        with pytest.raises(RetrieverUnavailableError, match=fragment) as info:
            client.search(["river"])
        assert url in str(info.value) and httpd.hits == 1


def test_garbage_access_and_health_answers():
    with stand_in(200, b'{"doc_id": "a"}') as (_, url):
        client = HTTPRetriever(url, timeout=2, retries=0)
        with pytest.raises(RetrieverUnavailableError, match="unexpected shape"):
            client.access("a")
        with pytest.raises(RetrieverUnavailableError, match="num_docs"):
            client.health()


def test_5xx_is_retried_then_reported():
    with stand_in(503, b'{"detail": "index reloading"}') as (httpd, url):
        client = HTTPRetriever(url, timeout=2, retries=2, backoff=0.01)
        with pytest.raises(RetrieverUnavailableError, match="after 3 attempt.*HTTP 503: index reloading"):
            client.search(["river"])
        assert httpd.hits == 3


def test_4xx_with_plain_text_is_not_retried():
    with stand_in(400, b"bad request, friend") as (httpd, url):
        client = HTTPRetriever(url, timeout=2, retries=3, backoff=0.01)
        with pytest.raises(InvalidRequestError, match="bad request, friend.*HTTP 400"):
            client.search(["river"])
        assert httpd.hits == 1


def test_slow_server_times_out():
    with stand_in(200, b'{"result": [[]]}', delay=8.0) as (httpd, url):
        client = HTTPRetriever(url, timeout=0.2, retries=1, backoff=0.01)
        started = time.monotonic()
        with pytest.raises(RetrieverUnavailableError, match="no answer within 0.2 s") as info:
            client.search(["river"])
        assert time.monotonic() - started < 5.0 and httpd.hits == 2 and url in str(info.value)


def test_client_reads_an_original_search_r1_server():
    answer = {"result": [[{"document": {"id": "0", "contents": '"Aaron"\nAaron is a prophet.'}, "score": 1.5}]]}
    with stand_in(200, json.dumps(answer).encode()) as (_, url):
        hits = HTTPRetriever(url, retries=0).search(["aaron"], 1)
    assert [(h.doc_id, h.title, h.text, h.score) for h in hits[0]] == [("0", "Aaron", "Aaron is a prophet.", 1.5)]


def test_closed_keep_alive_connection_is_reopened_without_counting_an_attempt():
    answer = {"result": [[{"document": {"id": "a", "title": "A", "contents": "A\ntext"}, "score": 1.0}]]}
    with stand_in(200, json.dumps(answer).encode(), drop_idle=True) as (httpd, url):
        client = HTTPRetriever(url, timeout=2, retries=0)
        for _ in range(3):
            assert client.search(["a"])[0][0].doc_id == "a"
        assert httpd.hits == 3
        client.close()


def test_client_keeps_one_connection_per_thread(server):
    client = HTTPRetriever(server.url, timeout=5, retries=0)
    client.search(["river"])
    first = client._local.conn.sock
    client.search(["stone"])
    assert client._local.conn.sock is first  # reused
    seen = []
    thread = threading.Thread(target=lambda: (client.search(["river"]), seen.append(client._local.conn.sock)))
    thread.start()
    thread.join()
    assert seen[0] is not first
    client.close()
    assert client._local.conn is None


class _Trickler:
    """A raw socket server that answers every request slowly: with `headers_first` it sends a whole
    status line and headers (Content-Length 10000) and then one body byte every `interval` s;
    otherwise it trickles the status line itself. Stops (and drops every connection) on `stop`."""

    def __init__(self, headers_first: bool, interval: float = 0.4):
        self.headers_first, self.interval = headers_first, interval
        self.stopped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections = 0
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        self.listener.settimeout(0.05)
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn):
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)  # the request (small, one segment on loopback)
                head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n"
                if self.headers_first:
                    conn.sendall(head)
                    head = b" " * 10000
                for i in range(len(head)):
                    if self.stopped.wait(self.interval):
                        return
                    conn.sendall(head[i:i + 1])
            except OSError:  # the client gave up and closed the connection
                return

    def stop(self):
        self.stopped.set()
        for thread in self.threads:
            thread.join(5)
        self.listener.close()


class _Flood:
    """A raw socket server whose every answer is a huge body: `head` (status line and headers),
    then `prefix`, then spaces in 64 kB chunks, at most `total` bytes (a bounded stand-in for a 1 GB
    body), then `suffix`. Counts the body bytes it managed to send before the client hung up."""

    def __init__(self, head: bytes, prefix: bytes, suffix: bytes, total: int):
        self.head, self.prefix, self.suffix, self.total = head, prefix, suffix, total
        self.sent: list[int] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve_one, daemon=True)
        self.thread.start()

    def _serve_one(self):
        self.listener.settimeout(10)
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        sent = 0
        with conn:
            conn.settimeout(10)
            try:
                conn.recv(65536)
                conn.sendall(self.head + self.prefix)
                chunk = b" " * 65536
                while sent < self.total:
                    conn.sendall(chunk)
                    sent += len(chunk)
                conn.sendall(self.suffix)
            except OSError:  # the client stopped reading and closed the connection
                pass
        self.sent.append(sent)

    def stop(self):
        self.listener.close()
        self.thread.join(10)


_HEALTH_OK = b'{"status": "ok", "num_docs": 3'
_FLOOD_BYTES = 16 << 20


@pytest.mark.parametrize("framing", ["close-delimited", "chunked"])
def test_client_bounds_a_huge_health_body(framing):
    """Issue 21, case 6: a /health body of 16 MB (standing in for 1 GB; no Content-Length to refuse
    it by) used to be read whole (and here, being valid JSON, accepted); now reading stops after
    MAX_HEALTH_BYTES with one clear error."""
    from mempo.env.client import MAX_HEALTH_BYTES

    if framing == "close-delimited":
        head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n"
        prefix, suffix = _HEALTH_OK, b"}"
    else:  # one chunk holding the whole body
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        prefix = f"{len(_HEALTH_OK) + _FLOOD_BYTES + 1:x}\r\n".encode() + _HEALTH_OK
        suffix = b"}\r\n0\r\n\r\n"
    flood = _Flood(head, prefix, suffix, _FLOOD_BYTES)
    try:
        client = HTTPRetriever(flood.url, timeout=20, retries=2, backoff=0.01)
        with pytest.raises(RetrieverUnavailableError, match=f"over the client's limit of {MAX_HEALTH_BYTES} bytes "
                                                            f"for /health") as info:
            client.health()
        assert flood.url in str(info.value) and "\n" not in str(info.value)
    finally:
        flood.stop()
    assert len(flood.sent) == 1  # not retried


def test_client_refuses_a_declared_length_over_the_bound_without_reading():
    """A Content-Length of 1 GB is refused at once (the old client waited to read it all: a timeout)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n"
    flood = _Flood(head, b'{"result": [[]]', b"", 0)
    try:
        client = HTTPRetriever(flood.url, timeout=5, retries=0)
        started = time.monotonic()
        with pytest.raises(RetrieverUnavailableError, match=r"limit of \d+ bytes for /retrieve \(its Content-Length"):
            client.search(["river"])
        assert time.monotonic() - started < 4  # answered before the attempt's timeout (not by it)
    finally:
        flood.stop()


def test_client_bounds_retrieve_and_access_bodies_by_max_response_bytes():
    body = json.dumps({"result": [[{"document": {"id": "a", "title": "A", "contents": "A\n" + "x" * 5000},
                                    "score": 1.0}]]}).encode()
    with stand_in(200, body) as (httpd, url):
        assert HTTPRetriever(url, retries=0).search(["q"])[0][0].text == "x" * 5000
        client = HTTPRetriever(url, retries=3, backoff=0.01, max_response_bytes=1000)
        with pytest.raises(RetrieverUnavailableError, match="limit of 1000 bytes for /retrieve.*max_response_bytes"):
            client.search(["q"])
        with pytest.raises(RetrieverUnavailableError, match="limit of 1000 bytes for /access"):
            client.access("a")
        assert httpd.hits == 3  # one each, never retried
    with stand_in(500, b"x" * (1 << 20)) as (httpd, url):  # an error body is read up to MAX_ERROR_BYTES only
        with pytest.raises(RetrieverUnavailableError, match="HTTP 500: x{200}"):
            HTTPRetriever(url, retries=0).search(["q"])
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_response_bytes must be an integer >= 1"):
            HTTPRetriever("http://127.0.0.1:1", max_response_bytes=bad)


@pytest.mark.parametrize("headers_first", [True, False], ids=["trickled-body", "trickled-status-line"])
def test_call_deadline_bounds_a_trickling_server(headers_first):
    """A per-read timeout restarts with every byte; the wall-clock limits do not (issue 10, case 4)."""
    trickler = _Trickler(headers_first)
    outcome = {}

    def call(client, key):
        started = time.monotonic()
        try:
            client.search(["river"])
            outcome[key] = ("returned", time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - recorded and checked below
            outcome[key] = (exc, time.monotonic() - started)

    try:
        client = HTTPRetriever(trickler.url, timeout=1, retries=1, backoff=0.25)
        assert client.deadline == pytest.approx(2.25)  # 2 attempts of 1 s + one 0.25 s sleep
        capped = HTTPRetriever(trickler.url, timeout=1, retries=10, deadline=1.5)
        threads = [threading.Thread(target=call, args=(client, "default"), daemon=True),
                   threading.Thread(target=call, args=(capped, "capped"), daemon=True)]
        for thread in threads:
            thread.start()
        margin = 3.0  # generous: a bound, not a benchmark (the machine is shared)
        for thread in threads:
            thread.join(client.deadline + margin)
        hung = [key for key in ("default", "capped") if key not in outcome]
        assert not hung, f"calls still blocked after {client.deadline + margin} s: {hung}"
        for key, limit in (("default", client.deadline), ("capped", capped.deadline)):
            exc, elapsed = outcome[key]
            assert isinstance(exc, RetrieverUnavailableError), (key, exc)
            assert f"{trickler.url}/retrieve" in str(exc) and "no answer within" in str(exc), str(exc)
            assert elapsed < limit + margin, (key, elapsed)
        assert "after 2 attempt(s)" in str(outcome["default"][0])
        assert "deadline 1.5 s" in str(outcome["capped"][0])
        # The search tool turns it into a failed call the trainer can count.
        result = SearchTool(HTTPRetriever(trickler.url, timeout=0.5, retries=0)).run("river")
        assert not result.ok and trickler.url in result.metadata["error"]
    finally:
        trickler.stop()


def test_watchdog_leaves_fast_calls_and_keep_alive_alone(server):
    client = HTTPRetriever(server.url, timeout=0.3, retries=0)
    for _ in range(20):  # much longer in total than one timeout: only each attempt is bounded
        client.search(["river"])
        time.sleep(0.02)
    first = client._local.conn.sock
    client.search(["stone"])
    assert client._local.conn.sock is first
    client.close()


def test_check_health(server, corpus):
    assert HTTPRetriever(server.url).check_health()["num_docs"] == len(corpus)
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(RetrieverUnavailableError, match="failed its health check.*cannot connect") as info:
        HTTPRetriever(url, timeout=0.5, retries=1, backoff=0.01).check_health()
    assert url in str(info.value)
    with stand_in(200, b"<html>hi</html>") as (_, garbage_url):
        with pytest.raises(RetrieverUnavailableError, match="failed its health check.*non-JSON"):
            HTTPRetriever(garbage_url, retries=0).check_health()
    with stand_in(500, b"boom") as (_, failing_url):
        with pytest.raises(RetrieverUnavailableError, match=f"{failing_url} failed its health check.*HTTP 500"):
            HTTPRetriever(failing_url, retries=1, backoff=0.01).check_health()
    with stand_in(200, b'{"status": "ok", "num_docs": 0}') as (_, empty_url):
        with pytest.raises(RetrieverUnavailableError, match="serves no documents"):
            HTTPRetriever(empty_url, retries=0).check_health()


class _SearchR1(http.server.BaseHTTPRequestHandler):
    """Search-R1's retrieval_server.py as the client sees it: /retrieve only, 404 elsewhere."""

    def do_GET(self):
        self.send_error(404)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"result": [[{"document": {"id": "0", "contents": '"A"\nB'}, "score": 1.0}]]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_check_health_accepts_a_search_r1_server_without_health():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SearchR1)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        assert HTTPRetriever(f"http://127.0.0.1:{httpd.server_address[1]}", retries=0).check_health() is None
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_in_process_retriever_health_check_is_a_no_op(bm25):
    assert bm25.check_health() is None


@pytest.mark.parametrize("keyword, value, fragment", [
    ("timeout", float("nan"), "timeout must be a finite number of seconds > 0"),
    ("timeout", float("inf"), "timeout must be a finite number"),
    ("timeout", -1, "timeout must be"),
    ("timeout", 0, "timeout must be"),
    ("timeout", "5", "timeout must be"),
    ("timeout", True, "timeout must be"),
    ("deadline", float("nan"), "deadline must be a finite number of seconds > 0 or None"),
    ("deadline", 0, "deadline must be"),
    ("backoff", float("inf"), "backoff must be a finite number of seconds >= 0"),
    ("max_backoff", -0.5, "max_backoff must be"),
    ("retries", -1, "retries must be an integer >= 0"),
    ("retries", 1.5, "retries must be an integer"),
])
def test_client_rejects_bad_time_limits(keyword, value, fragment):
    with pytest.raises(ValueError, match=fragment):
        HTTPRetriever("http://127.0.0.1:1", **{keyword: value})


def test_client_rejects_bad_configuration():
    for bad in ["127.0.0.1:8000", "ftp://x", ""]:
        with pytest.raises(ValueError):
            HTTPRetriever(bad)
    with pytest.raises(ValueError):
        HTTPRetriever("http://127.0.0.1:1", timeout=0)


# ------------------------------------------------------------------------------------------------
# the CLI
# ------------------------------------------------------------------------------------------------

def _start_cli(args: list[str]) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "mempo.apps.cli", "serve-retriever", *args],
                            cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        line = lines.get(timeout=30)
    except queue.Empty:
        proc.kill()
        raise AssertionError(f"no readiness line; stderr: {proc.communicate(timeout=5)[1]}")
    return proc, line


def _stop_cli(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, stderr = proc.communicate(timeout=5)
    return proc.returncode, stderr


def test_cli_serve_retriever_subprocess(tmp_path, corpus):
    corpus_path, index_dir = tmp_path / "corpus.jsonl", tmp_path / "index"
    write_corpus(corpus_path, corpus)
    args = ["--corpus", str(corpus_path), "--index-dir", str(index_dir), "--port", "0", "--topk-max", "20",
            "--max-doc-chars", "7000", "--max-response-chars", "900000"]
    for run in ("build", "load"):
        proc, line = _start_cli(args)
        try:
            assert line.startswith("mempo-retriever ready url=http://127.0.0.1:"), line
            fields = dict(part.split("=", 1) for part in line.split()[2:])
            assert fields["docs"] == str(len(corpus)) and fields["retriever"] == "bm25"
            client = HTTPRetriever(fields["url"], timeout=5, retries=0)
            health = client.health()
            assert (health["topk_max"], health["max_doc_chars"], health["max_response_chars"]) == (20, 7000, 900_000)
            assert client.search(["zebulon9"], 2)[0][0].doc_id == "needle-9"
            assert client.access("long-1", 2).num_pages == 3
        finally:
            returncode, stderr = _stop_cli(proc)
        assert returncode == 130, stderr
        assert ("built BM25 index" in stderr) == (run == "build") and ("loaded BM25 index" in stderr) == (run == "load")
        assert (index_dir / "mempo_index.json").is_file()


def test_cli_usage_errors(tmp_path, capsys):
    assert cli_main(["serve-retriever"]) == 2
    assert cli_main(["serve-retriever", "--corpus", str(tmp_path / "absent.jsonl")]) == 2
    assert cli_main(["serve-retriever", "--corpus", "x", "--topk-default", "9", "--topk-max", "5"]) == 2
    assert cli_main(["serve-retriever", "--corpus", "x", "--max-doc-chars", "0"]) == 2
    assert cli_main(["serve-retriever", "--corpus", "x", "--max-response-chars", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--max-response-chars must be >= 1" in err
    lines = err.strip().splitlines()  # each user error: one line from mempo.apps.cli.main
    assert len(lines) == 5 and all(line.startswith("mempo serve-retriever: ") for line in lines), lines
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    assert cli_main(["serve-retriever", "--corpus", str(bad)]) == 2
    assert f"{bad}:2: duplicate id 'a'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli_main(["no-such-command"])
    assert info.value.code == 2


def test_cli_port_taken(tmp_path, corpus):
    corpus_path = tmp_path / "corpus.jsonl"
    write_corpus(corpus_path, corpus[:20])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert cli_main(["serve-retriever", "--corpus", str(corpus_path), "--port", str(port)]) == 1
