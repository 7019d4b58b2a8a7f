"""Test setup: run Triton kernels through the CPU interpreter when no GPU is present.

TRITON_INTERPRET must be set before `mempo.kernels` is imported, hence here, at collection start.
"""
import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; this machine has none (GPU tier)")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture
def device():
    """Device for Triton-path tests: CUDA when present, else CPU under the interpreter."""
    return torch.device("cuda" if HAS_CUDA else "cpu")


@pytest.fixture(scope="session")
def corpus():
    """300 generated documents (needles, long documents): tests/support/corpus.py."""
    from support.corpus import make_corpus

    return make_corpus()


@pytest.fixture(scope="session")
def bm25(corpus):
    """An in-process BM25 retriever over `corpus`."""
    from mempo.env.bm25 import BM25Retriever

    retriever = BM25Retriever.build(corpus)
    yield retriever
    retriever.close()


@pytest.fixture
def qa_files(tmp_path):
    """(qa.jsonl, mixed.jsonl) and corpus.jsonl in `tmp_path`: tests/support/qa_eval.py."""
    from support.qa_eval import write_qa_files

    return write_qa_files(tmp_path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Qwen2 and its own BPE saved as a plain HF directory: tests/support/qa_eval.py."""
    from support.qa_eval import save_tiny_model_dir

    return save_tiny_model_dir(tmp_path_factory.mktemp("model"))
