"""mempo.env.closed_book: a retriever that finds nothing, checking requests as every retriever does."""
import pytest

from mempo.env.closed_book import ClosedBookRetriever
from mempo.env.retriever import DocumentNotFoundError, InvalidRequestError
from mempo.env.tools import make_tools


def test_every_search_finds_nothing_and_every_access_is_not_found():
    retriever = ClosedBookRetriever()
    assert retriever.num_docs == 0
    assert retriever.search(["Where was Tamor born?", "x"], topk=3) == [[], []]
    with pytest.raises(DocumentNotFoundError, match="closed-book"):
        retriever.access("person-000001")
    for queries, topk in (([], 1), (["  "], 1), (["q"], 0), ("q", 1)):
        with pytest.raises(InvalidRequestError):
            retriever.search(queries, topk)
    tools = make_tools(retriever)
    result = tools["search"].run("Where was Tamor born?")
    assert result.ok and "No results found" in result.text and result.metadata["doc_ids"] == []
    assert not tools["access"].run("person-000001").ok
