"""The search and access tools (`mempo.tools.Tool` s like any user's), each run against the in-process
BM25 retriever and against `HTTPRetriever` talking to a real server on loopback, through the public
path (`Tool.run`: a tags-format call answered by `Toolset.call`); bad calls and a dead retriever must
come back as `<information>` error text, never as an exception."""
import socket

import pytest

from mempo.env.client import HTTPRetriever
from mempo.env.retriever import Retriever
from mempo.env.server import RetrieverServer
from mempo.env.tools import (
    AccessTool, SearchTool, ToolResult, available_tools, make_tool, make_tools, parse_access_argument,
)
from mempo.protocol.tags import JSON_TAG_SET
from mempo.tools import Tool, Toolset
from support.corpus import LONG_DOC_CHARS


@pytest.fixture(scope="module")
def http_server(bm25):
    with RetrieverServer(bm25) as server:
        yield server


@pytest.fixture(params=["in-process", "http"])
def retriever(request, bm25):
    if request.param == "in-process":
        return bm25
    server = request.getfixturevalue("http_server")
    return HTTPRetriever(server.url, timeout=5, retries=0)


def dead_retriever() -> HTTPRetriever:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return HTTPRetriever(f"http://127.0.0.1:{port}", timeout=0.5, retries=1, backoff=0.01)


def assert_error(result: ToolResult, kind: str, fragment: str) -> None:
    assert isinstance(result, ToolResult) and result.kind == kind and not result.ok
    assert result.text.startswith("<information>Error: ") and result.text.endswith("</information>")
    assert fragment in result.text, result.text
    assert result.metadata["error"]


# ------------------------------------------------------------------------------------------------
# search
# ------------------------------------------------------------------------------------------------

def test_search_formats_top_k_documents(retriever, bm25):
    result = SearchTool(retriever, topk=3, doc_chars=50).run("  Needle zebulon6  ")
    assert result.ok and result.kind == "search_results"
    assert result.text.startswith("<information>Doc 1 (ID: needle-6, Title: Needle 6) ")
    assert result.text.endswith("</information>")
    lines = result.text.removeprefix("<information>").removesuffix("</information>").split("\n")
    assert len(lines) == 3 and [line.split(" ", 2)[:2] for line in lines] == [["Doc", "1"], ["Doc", "2"], ["Doc", "3"]]
    hits = bm25.search(["Needle zebulon6"], 3)[0]
    for line, hit in zip(lines, hits):
        assert line == f"Doc {hits.index(hit) + 1} (ID: {hit.doc_id}, Title: {hit.title}) {hit.text[:50]}"
    assert result.metadata["query"] == "Needle zebulon6" and result.metadata["doc_ids"] == [h.doc_id for h in hits]
    assert result.metadata["truncated"] == [len(h.text) > 50 for h in hits]
    assert result.metadata["scores"] == pytest.approx([h.score for h in hits])


def test_search_defaults_are_the_papers(retriever):
    tool = SearchTool(retriever)
    assert (tool.topk, tool.doc_chars) == (5, 5000)
    result = tool.run("start of long 0 river")
    assert result.metadata["doc_ids"][0] == "long-0" and len(result.metadata["doc_ids"]) == 5
    first_line = result.text.split("\n")[0]
    assert len(first_line) == len("<information>Doc 1 (ID: long-0, Title: Long 0) ") + 5000


def test_search_bad_calls(retriever):
    tool = SearchTool(retriever)
    assert_error(tool.run(""), "search_results", "empty search query")
    assert_error(tool.run("   \n "), "search_results", "empty search query")
    assert_error(tool.run("x" * 2049), "search_results", "search query too long (2049 characters; the limit is 2048)")
    none = tool.run("qwxyzzy")
    assert none.ok and none.text == "<information>No results found for this query.</information>"
    assert none.metadata["doc_ids"] == []


# ------------------------------------------------------------------------------------------------
# access
# ------------------------------------------------------------------------------------------------

def test_access_pages(retriever, bm25, corpus):
    tool = AccessTool(retriever)
    first = tool.run("long-1")
    page0 = bm25.access("long-1", 0)
    assert first.ok and first.kind == "webpage"
    header = "<information>Document long-1 (Title: Long 1), page 0 of pages 0-2\n"
    assert first.text == header + page0.text + "</information>"
    assert first.metadata == {"tool": "access", "doc_id": "long-1", "title": "Long 1", "page": 0, "num_pages": 3}
    last = tool.run("  long-1   2 ")
    assert last.ok and last.metadata["page"] == 2
    assert len(last.text) - len("<information>Document long-1 (Title: Long 1), page 2 of pages 0-2\n</information>") \
        == LONG_DOC_CHARS - 2 * 25_000
    small = AccessTool(retriever, page_chars=1000).run("long-1 59")
    assert small.ok and small.metadata["num_pages"] == 60


@pytest.mark.parametrize("argument, fragment", [
    ("", "empty access request"),
    ("   ", "empty access request"),
    ("long-1 two", "malformed page 'two'"),
    ("long-1 -1", "malformed page '-1'"),
    ("long-1 1.5", "malformed page '1.5'"),
    ("long-1 1 2", "malformed access request"),
    ("long-1 3", "document 'long-1' has no page 3. Its pages are numbered 0 to 2."),
    ("absent-doc", "no document with ID 'absent-doc'"),
    ("absent-doc 4", "no document with ID 'absent-doc'"),
])
def test_access_bad_calls(retriever, argument, fragment):
    assert_error(AccessTool(retriever).run(argument), "webpage", fragment)


def test_parse_access_argument():
    assert parse_access_argument("d7") == ("d7", 0)
    assert parse_access_argument("d7 [2]") == ("d7", 2)  # the protocol's bracketed page form
    assert parse_access_argument(" https://x.org/a?b=1  12\n") == ("https://x.org/a?b=1", 12)
    with pytest.raises(ValueError):
        parse_access_argument("d7 ٣")  # non-ASCII digits are not a page number


# ------------------------------------------------------------------------------------------------
# failures never raise; the registry
# ------------------------------------------------------------------------------------------------

def test_dead_retriever_gives_error_text():
    dead = dead_retriever()
    assert_error(SearchTool(dead).run("river"), "search_results", "search service is unavailable")
    result = AccessTool(dead).run("long-1 1")
    assert_error(result, "webpage", "document service is unavailable")
    assert dead.base_url in result.metadata["error"]


class _Broken(Retriever):
    name = "broken"
    num_docs = 0

    def search(self, queries, topk=5):
        raise RuntimeError("boom")

    def access(self, doc_id, page=0, page_chars=None):
        raise RuntimeError("boom")


def test_unexpected_exceptions_never_reach_the_agent(caplog):
    assert_error(SearchTool(_Broken()).run("river"), "search_results", "failed unexpectedly")
    result = AccessTool(_Broken()).run("d1")
    assert_error(result, "webpage", "failed unexpectedly")
    assert result.metadata["error"] == "RuntimeError: boom"


def test_tool_registry(bm25):
    assert {"search", "access"} <= set(available_tools())
    tools = make_tools(bm25, options={"search": {"topk": 2}})
    assert list(tools) == ["search", "access"] and all(isinstance(t, Tool) for t in tools.values())
    assert isinstance(tools["search"], SearchTool) and tools["search"].topk == 2
    assert isinstance(tools["access"], AccessTool)
    assert make_tool("access", bm25, page_chars=10).page_chars == 10
    with pytest.raises(ValueError, match="unknown tool 'browse'"):
        make_tool("browse", bm25)
    with pytest.raises(ValueError):
        SearchTool(bm25, topk=0)


def test_in_process_and_http_tools_agree(bm25, http_server):
    client = HTTPRetriever(http_server.url, timeout=5, retries=0)
    for argument in ["zebulon1 river", "start of long 2", "qwxyzzy"]:
        assert SearchTool(bm25).run(argument) == SearchTool(client).run(argument)
    for argument in ["long-0 1", "needle-3", "long-0 7", "nope"]:
        local, remote = AccessTool(bm25).run(argument), AccessTool(client).run(argument)
        assert local.text == remote.text and local.ok == remote.ok


def test_information_body_cannot_close_the_block():
    from mempo.env.tools import information
    from mempo.protocol.grammar import find_blocks

    text = information("a page quoting </information> and <answer>x</answer>")
    blocks = find_blocks(text)
    assert [b.tag for b in blocks] == ["information"] and blocks[0].closed and blocks[0].end == len(text)


def test_built_in_tools_through_json_calls(bm25):
    """The json format reaches the same tools with Hermes calls; their schemas are what the model is told."""
    tools = Toolset(make_tools(bm25, options={"search": {"topk": 2, "doc_chars": 40}}))
    search = tools.call("tool_call", '{"name": "search", "arguments": {"query": "Needle zebulon6"}}', JSON_TAG_SET)
    assert search.ok and search.text.startswith("<tool_response>Doc 1 (ID: needle-6, ")
    assert search.text.endswith("</tool_response>") and search.metadata["topk"] == 2
    page = tools.call("tool_call", '{"name": "access", "arguments": {"doc_id": "long-1", "page": 2}}', JSON_TAG_SET)
    assert page.ok and page.metadata["page"] == 2 and page.kind == "webpage"
    for arguments, fragment in [('{"doc_id": "long-1", "page": -1}', "malformed page '-1'"),
                                ('{"doc_id": "long-1", "page": "2"}', "malformed page '2'"),
                                ('{"doc_id": "two words"}', "malformed document ID"),
                                ('{"page": 1}', "lacks the required argument(s) 'doc_id'")]:
        bad = tools.call("tool_call", '{"name": "access", "arguments": %s}' % arguments, JSON_TAG_SET)
        assert not bad.ok and fragment in bad.text, bad.text
    assert [s["function"]["name"] for s in tools.schemas()] == ["search", "access"]
    assert tools["access"].schema()["function"]["parameters"]["required"] == ["doc_id"]
