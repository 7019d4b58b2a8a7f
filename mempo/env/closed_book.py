"""`ClosedBookRetriever`: a retriever that finds nothing, for the closed-book evaluation
(``eval.closed_book``): the same model and protocol with every search answered "No results found"
and every access "not found", so EM without retrieval can be read next to EM with it.
"""
from __future__ import annotations

from typing import Optional, Sequence

from mempo.env.retriever import DEFAULT_TOPK, DocumentNotFoundError, Hit, Page, Retriever, check_queries, check_topk

__all__ = ["ClosedBookRetriever"]


class ClosedBookRetriever(Retriever):
    """Answers every search with no hits and every access with `DocumentNotFoundError`; requests are
    checked as every retriever checks them (`check_queries`, `check_topk`)."""

    name = "closed_book"

    @property
    def num_docs(self) -> int:
        return 0

    def search(self, queries: Sequence[str], topk: int = DEFAULT_TOPK) -> list[list[Hit]]:
        """``[[]] * len(queries)``: no document for any query."""
        checked = check_queries(queries)
        check_topk(topk)
        return [[] for _ in checked]

    def access(self, doc_id: str, page: int = 0, page_chars: Optional[int] = None) -> Page:
        """Always `DocumentNotFoundError` (closed book: no document can be read)."""
        raise DocumentNotFoundError(f"unknown document id {doc_id!r} (closed-book evaluation: no documents)")
